"""Run `bpm demo` with some of its knobs (`bpm_app.demo.run.DemoSettings`) set otherwise:
the experiments of docs/benchmarks.md, "Demo runs".

    usage: scripts/demo-with.py NAME=VALUE ... -- DEMO-OPTIONS
    e.g.   scripts/demo-with.py fill=1.0 -- --headless --json --workdir W --report R

NAME is a numeric field of DemoSettings (min_duration_s, fill, warmup_spare_s, ...); the options
after `--` are those of `bpm demo`.
"""

from __future__ import annotations

import dataclasses
import functools
import sys

# Knobs `bpm demo` sets from its own options, whatever a NAME=VALUE says: set them there.
OPTIONS = {"port": "--port", "phase_timeout_s": "--phase-timeout", "cpus": "--cpus", "boot_cpus": "--boot-cpus"}


def overrides(arguments: list[str]) -> dict[str, float | int]:
    """The NAME=VALUE arguments as DemoSettings fields; SystemExit with a readable message on any other."""
    from bpm_app.demo.run import DemoSettings

    numeric = {f.name: int if f.type == "int" else float for f in dataclasses.fields(DemoSettings) if f.type in ("float", "int", "float | None")}
    out: dict[str, float | int] = {}
    for argument in arguments:
        name, sep, value = argument.partition("=")
        if name in OPTIONS:
            raise SystemExit(f"{name}: `bpm demo` sets it from its option {OPTIONS[name]}: give that after `--`")
        if not sep or name not in numeric:
            raise SystemExit(f"not NAME=VALUE with NAME one of {', '.join(sorted(numeric))}: {argument!r}")
        try:
            out[name] = numeric[name](value)
        except ValueError:
            raise SystemExit(f"{name}: not a number of its type ({numeric[name].__name__}): {value!r}") from None
    return out


def main(argv: list[str]) -> None:
    if "--" not in argv:
        raise SystemExit(__doc__)
    cut = argv.index("--")
    settings = overrides(argv[:cut])
    from bpm_app.cli import app
    from bpm_app.demo import run

    run.DemoSettings = functools.partial(run.DemoSettings, **settings)  # read by `bpm demo` when it runs
    print(f"demo settings set: {settings}", file=sys.stderr)
    app(["demo", *argv[cut + 1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
