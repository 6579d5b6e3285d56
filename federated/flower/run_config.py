"""The Flower app's typed run config (``[tool.flwr.app.config]``) as federate's config, and back.

A Flower user sets a run with ``flwr run . --run-config "algo='scaffold' alpha=0.1"``: every key is one of
federate's settings in kebab case (``local-epochs`` is ``--local-epochs``), Flower's usual
``num-server-rounds`` is ``--rounds``, ``set`` is ``--set`` as space-separated ``KEY=VALUE`` pairs, and the
run keys ``out``, ``device`` and ``resume`` are :class:`federated.experiment.RunOptions`'. TOML has no null:
an empty string (or ``none``) means federate's default for that key (the dataset's Table-9 preset for
``lr``, ``batch-size``, ``optimizer``, ``arch``, ``partition``). Values are typed as the flags are
(:func:`fpsfl.base.settings.coerce`); an unknown key is a one-line ValueError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fpsfl.base.settings import coerce, field_types, flat_types

from ..experiment import FederateConfig, RunOptions, flat_settings, merge

ALIASES = {"num-server-rounds": "rounds"}  # Flower's name for the round count
# RunOptions' (not the result's)
RUN_KEYS = ("out", "device", "resume", "flower-timeout", "min-replies", "shards", "node-names", "node-wait",
            "tensorboard")
NOT_HERE = {"tracking", "algo_args", "partition_args", "data_args"}  # nested: set, or the CLI's own flags


def options_from_run_config(run_config: dict[str, Any]) -> tuple[FederateConfig, RunOptions]:
    """federate's config and run options from a Flower run config (engine flower)."""
    cfg_types = {k: v for k, v in flat_types(FederateConfig).items() if k not in NOT_HERE}
    plugin = {name: f.type for known in flat_settings().values() for name, f in known.items()}  # flat ones
    run_types = {k: v for k, v in field_types(RunOptions).items()
                 if k.replace("_", "-") in RUN_KEYS}
    values: dict[str, Any] = {}
    run: dict[str, Any] = {}
    algo_args: dict[str, str] = {}
    for key, value in run_config.items():
        name = ALIASES.get(key, key).replace("-", "_")
        if key == "set":
            algo_args = dict(_pair(p) for p in str(value).split())
            continue
        if isinstance(value, str) and value.strip() == "":
            continue  # federate's default
        if name in cfg_types:
            values[name] = coerce(key, value, cfg_types[name])
        elif name in plugin:
            values[name] = coerce(key, value, _kind(plugin[name]))
        elif name in ("out", "shards", "tensorboard"):
            run[name] = Path(str(value)).expanduser()
        elif name in run_types:
            run[name] = coerce(key, value, run_types[name])
        else:
            raise ValueError(f"run config: unknown key {key!r} (keys are federate's settings in kebab case, "
                             f"num-server-rounds, set, {', '.join(RUN_KEYS)})")
    cfg = merge({**values, "algo_args": algo_args})
    if run.get("out") is None:
        run["out"] = Path(f"runs/{cfg.dataset}-{cfg.partition}-{cfg.algo}-s{cfg.seed}-flower")
    opts = RunOptions(**run, engine="flower", progress=False, log_rounds=True)
    return cfg, opts


def run_config_of(cfg: FederateConfig, opts: RunOptions) -> dict[str, Any]:
    """The run config that :func:`options_from_run_config` reads back as ``cfg`` and ``opts``: what
    ``federate --engine flower`` hands the app (None values left out: federate's defaults)."""
    record = {k: v for k, v in cfg.settings(plain=True).items() if k not in NOT_HERE}
    for table in flat_settings():  # the partitions' and datasets' settings, flat as the CLI's flags
        record.update(getattr(cfg, table))
    out: dict[str, Any] = {}
    for name, value in record.items():
        if value is None or value == ():
            continue
        out[name.replace("_", "-")] = ",".join(map(str, value)) if isinstance(value, tuple) else value
    if cfg.algo_args:
        out["set"] = " ".join(f"{k}={v}" for k, v in cfg.algo_args.items())
    for key in RUN_KEYS:
        value = getattr(opts, key.replace("-", "_"), None)
        if value is not None:
            out[key] = str(value) if isinstance(value, Path) else value
    return out


def _kind(annotation: Any) -> Any:
    """A partition's or dataset's setting's annotation, resolved (their files use future annotations)."""
    if not isinstance(annotation, str):
        return annotation
    return {"int": int, "float": float, "str": str, "bool": bool, "int | None": int | None,
            "float | None": float | None, "str | None": str | None}.get(annotation, str)


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"run config set: expected KEY=VALUE pairs, got {text!r}")
    return key.strip(), value.strip()
