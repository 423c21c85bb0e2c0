"""What the Dockerfile's runtime stage says about the container it makes: its base image and
its environment, read from the Dockerfile (never copied), for the chart and image tests."""

from __future__ import annotations

import re
import shlex

from .test_dockerfile import exec_form, one, stages

# The python image's own ENV that matters to what runs on it (its PATH has /usr/local first).
PYTHON_IMAGE_ENV = {"PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "LANG": "C.UTF-8"}
BASE_IMAGE = re.compile(r"python:(?P<python>\d+\.\d+)-slim-(?P<suite>[a-z]+)")


def base_image() -> re.Match[str]:
    """The runtime stage's base, python:<X.Y>-slim-<Debian suite>, as groups python, suite."""
    source = one("FROM", stages()[-1]).split()[0]
    match = BASE_IMAGE.fullmatch(source)
    assert match, f"the runtime stage's base {source} is not python:X.Y-slim-<suite>"
    return match


def parse_env(args: str, env: dict[str, str]) -> dict[str, str]:
    """One ENV instruction (key=value pairs; $VAR and ${VAR} expanded from `env`)."""
    out = {}
    for pair in shlex.split(args):
        key, sep, value = pair.partition("=")
        assert sep, f"ENV {args}: only the key=value form is replayed"
        out[key] = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)
    return out


def runtime_env() -> dict[str, str]:
    """The image's environment: the python image's, then the runtime stage's ENV lines."""
    env = dict(PYTHON_IMAGE_ENV)
    for ins, args in stages()[-1]:
        if ins == "ENV":
            env.update(parse_env(args, env))
    return env


def entrypoint_and_cmd() -> tuple[list[str], list[str]]:
    final = stages()[-1]
    return exec_form(one("ENTRYPOINT", final)), exec_form(one("CMD", final))
