"""Tests of the ext_proc response cache (issue 4)."""
