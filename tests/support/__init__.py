"""Test harness pieces shared by every suite (import as `from support.<module> import …`)."""
