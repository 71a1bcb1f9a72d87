"""From what a user typed to the run to make: command-line values over an experiment file, a
resumed run's stored configuration, and the process group.

Contract: :func:`plan_run` takes the values a front end parsed (``values``: every
:class:`~fl.config.ExperimentConfig` field and process key, ``given``: the names the user set
explicitly), an experiment file and the ``--out``/``--resume`` folders, and returns a
:class:`RunPlan`: the validated configuration, the output folder, whether to resume, and the
process group (:func:`fl.distributed.process_group`). A value set on the command line wins over
the file's, and the file's over the default; an error about a value that came from the file
names the file. Resuming takes the stored ``config.json`` and refuses explicit settings that
differ from it. Nothing here starts JAX, so :func:`fl.distributed.initialize` may follow.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fl.config import FIELDS, PROCESS_FIELDS, ExperimentConfig, load_toml, validate
from fl.distributed import ProcessGroup, process_group
from fl.run_folder import CONFIG
from fl.simulation import load_config_json
from simbase.errors import AisimError


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The run to make: its configuration, output folder, whether it resumes, its processes."""

    cfg: ExperimentConfig
    out_dir: Path | None
    resume: bool
    group: ProcessGroup | None


def _relabel(e: AisimError, sources: dict[str, str]) -> AisimError:
    """``e`` naming the file its field's value came from (command-line values keep none)."""
    if e.source is None and e.field in sources:
        return e.relabel(source=sources[e.field])
    return e


def _group(values: dict, given: set[str], file_values: dict, config) -> ProcessGroup | None:
    placed, from_file = {}, {}
    for name in PROCESS_FIELDS:  # the command line wins over the experiment file
        in_file = file_values.pop(name, None)
        placed[name] = values.get(name)
        if name not in given and in_file is not None:
            placed[name], from_file[name] = in_file, str(config)
    try:
        return process_group(**placed)
    except AisimError as e:
        raise _relabel(e, from_file) from None


def plan_run(
    values: dict,
    given: set[str],
    config: Path | None = None,
    out: Path | None = None,
    resume: Path | None = None,
) -> RunPlan:
    """The run that ``values`` (with ``given`` set explicitly), ``config``, ``out`` and
    ``resume`` ask for (see module)."""
    file_values = load_toml(config) if config is not None and resume is None else {}
    group = _group(values, given, file_values, config)
    if group is not None and resume is not None and group.num_processes > 1:
        raise AisimError("--resume runs in one process; drop --coordinator")
    if resume is not None:
        if out is not None and Path(out) != Path(resume):
            raise AisimError("--resume DIR writes into DIR; drop --out or make it the same")
        asked = {k: values[k] for k in given if k in FIELDS}
        cfg = load_config_json(resume, asked)
        sources = dict.fromkeys(FIELDS, str(Path(resume) / CONFIG))
        out_dir: Path | None = Path(resume)
    else:
        merged, sources = {}, {}
        for name in FIELDS:
            if name in file_values and name not in given:
                merged[name], sources[name] = file_values[name], str(config)
            else:
                merged[name] = values[name]
        cfg, out_dir = ExperimentConfig(**merged), out
    try:
        validate(cfg)
    except AisimError as e:
        raise _relabel(e, sources) from None
    return RunPlan(cfg, out_dir, resume is not None, group)
