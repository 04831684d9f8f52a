"""The house rules, checked on the source: every module imports on its own, no import cycles, no
private names borrowed across modules, no function longer than a screenful, imports at the top
unless a comment says why not, layers that import only downwards (the application, the driver,
the policies, the config, the trial, the model and data and decisions, the shared modules), and
the rooms of docs/architecture.md (model imports only torch, data knows nothing of models, analysis imports nothing of
fusion_ray but the shared schema, the redaction and the store-fault classifier, which import only
the standard library, and the decision code below both), and layers that point one way (the
engine reaches the analysis only through the application layer, and the API does not import the
command line)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fusion_ray", "analysis")
MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {
    _module_name(path): path
    for package in PACKAGES
    for path in sorted((ROOT / package).rglob("*.py"))
}


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names, line) of every import in the file, at any depth (lazy imports too)."""
    found = []
    package = (
        _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    )
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative import
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found.append((module, [alias.name for alias in node.names], node.lineno))
    return found


def _edges(name: str) -> set[str]:
    """Project modules that ``name`` imports; ``from pkg import sub`` counts as importing pkg.sub."""
    out = set()
    for module, names, _ in _imports(MODULES[name]):
        targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES] or [module]
        out |= {t for t in targets if t in MODULES and t != name}
    return out


_IMPORT_EACH_ALONE = r"""
import importlib, os, sys, traceback
third_party, names, ours = (arg.split(",") for arg in sys.argv[1:4])
for module in third_party:
    try:
        importlib.import_module(module)
    except Exception:  # an optional dependency: the module that needs it meets it as it would
        pass
early = sorted(m for m in sys.modules if m.split(".")[0] in ours)
assert not early, f"a third-party import pulled in {early}"
failed = 0
for name in names:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a copy of this interpreter, in which no module of the project is imported yet
        os.close(read)
        try:
            importlib.import_module(name)
            os._exit(0)
        except BaseException:
            os.write(write, traceback.format_exc()[-2000:].encode())
            os._exit(1)
    os.close(write)
    with os.fdopen(read) as pipe:
        error = pipe.read()
    if os.waitpid(pid, 0)[1] != 0:
        failed += 1
        print(f"import {name} failed:\n{error}", flush=True)
sys.exit(1 if failed else 0)
"""


def _third_party_imports() -> list[str]:
    """Every module outside the project that the project's modules import, at any depth."""
    found = {
        module
        for path in MODULES.values()
        for module, _, _ in _imports(path)
        if module and module.split(".")[0] not in PACKAGES and module != "__future__"
    }
    return sorted(found)


@pytest.mark.process
@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_imports_alone_in_a_fresh_interpreter(package):
    """Each module imported as the first of the project's in an interpreter: a fresh one that
    has imported the third-party modules the project imports (torch, Ray, MLflow: seconds each),
    then forks a copy per module, so that no module depends on another of ours having been
    imported before it. Third-party modules are the same objects whichever of ours asks."""
    names = [m for m in MODULES if m.split(".")[0] == package]
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH_ALONE, ",".join(_third_party_imports()),
         ",".join(names), ",".join(PACKAGES)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


@pytest.mark.unit
def test_no_import_cycles():
    graph = {name: _edges(name) for name in MODULES}
    # A package's __init__ re-exporting its own submodules is not a cycle of the submodules.
    for name in graph:
        graph[name] = {
            t
            for t in graph[name]
            if not (name.startswith(t + ".") and MODULES[t].name == "__init__.py")
        }
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt] if nxt in stack else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.unit
def test_no_private_names_imported_across_modules():
    borrowed = [
        f"{path.relative_to(ROOT)}:{line}: from {module} import {n}"
        for path in [*MODULES.values(), *sorted((ROOT / "bench").glob("*.py"))]
        for module, names, line in _imports(path)
        if module.split(".")[0] in PACKAGES
        for n in names
        if n.startswith("_") and not n.startswith("__")
    ]
    assert not borrowed, "private names used outside their module:\n" + "\n".join(borrowed)


@pytest.mark.unit
def test_no_function_is_longer_than_a_screenful():
    long = []
    for path in [*MODULES.values(), *sorted((ROOT / "bench").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines"
                    )
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


@pytest.mark.unit
@pytest.mark.parametrize(
    "room, allowed",
    [
        (
            "fusion_ray.model",
            {
                "torch",
                "annotated_types",
                "fusion_ray.model",
                "fusion_ray.lazy",  # the package's names on first use (standard library only)
                "fusion_ray.registry",
                "fusion_ray.checks",
                "fusion_ray.seeds",
            },
        ),
        (
            "fusion_ray.data",
            {
                "numpy",
                "torch",
                "tokenizers",
                "filelock",
                "pandas",
                "pyarrow",
                "datasets",
                "annotated_types",
                "sklearn",  # the reference baselines (bag-of-words)
                "fusion_ray.data",
                "fusion_ray.lazy",  # the package's names on first use (standard library only)
                "fusion_ray.registry",
                "fusion_ray.checks",
            },
        ),
        (
            "analysis",
            {
                "numpy",
                "pandas",
                "scipy",
                "statsmodels",
                "matplotlib",
                "mlflow",
                "pyarrow",
                "sqlalchemy",
                "analysis",
                "annotated_types",
                "fusion_ray.schema",
                "fusion_ray.registry",  # the registry class (standard library only), as the schema
                "fusion_ray.redact",  # credentials out of every text (standard library only)
                "fusion_ray.decide",  # the decision code on paired seeds, below both packages
                "fusion_ray.other_settings",  # runs of other settings, worded once (stdlib only)
                "fusion_ray.store_errors",  # a store's faults, classified once (stdlib only)
                "markdown",  # report.html from report.md (pure Python, a runtime dependency)
                "yaml",  # the report's --labels file (display names)
            },
        ),
        ("fusion_ray.trainables", {"fusion_ray.trainables", "fusion_ray.registry"}),
        ("fusion_ray.schema", set()),
        ("fusion_ray.store_errors", {"fusion_ray.redact"}),
        ("fusion_ray.redact", set()),
        (
            "fusion_ray.decide",
            {
                "numpy",
                "scipy",
                "annotated_types",
                "fusion_ray.decide",
                "fusion_ray.registry",
                "fusion_ray.schema",  # metric names (standard library only)
            },
        ),
    ],
)
def test_rooms_import_only_what_they_may(room, allowed):
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    wrong = []
    for name, path in MODULES.items():
        if name != room and not name.startswith(room + "."):
            continue
        for module, _, line in _imports(path):
            top = module.split(".")[0]
            if top in stdlib or any(module == a or module.startswith(a + ".") for a in allowed):
                continue
            wrong.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not wrong, f"{room} imports outside its room:\n" + "\n".join(wrong)


@pytest.mark.unit
def test_the_ray_boundary_is_a_typed_job_not_a_dict_of_strings():
    """What crosses into the study's trial's process is ``TrialJob``: the trial's entry
    (``fusion_ray.study.trial``) reads no value out of a mapping by a string key (a payload
    dict), and its trainable takes the job."""
    import inspect

    from fusion_ray.study import trial
    from fusion_ray.study.trial import TrialJob

    source = (ROOT / "fusion_ray" / "study" / "trial.py").read_text()
    reads = [
        f"study/trial.py:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Load)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ]
    assert not reads, "string-key reads in the trial's entry:\n" + "\n".join(reads)
    hints = inspect.get_annotations(trial.run_cell, eval_str=True)
    assert hints["job"] is TrialJob


@pytest.mark.process
@pytest.mark.parametrize(
    "shared, loads",
    [
        ("fusion_ray.schema", ["fusion_ray", "fusion_ray.schema"]),
        ("fusion_ray.store_errors", ["fusion_ray", "fusion_ray.redact", "fusion_ray.store_errors"]),
        ("fusion_ray.other_settings", ["fusion_ray", "fusion_ray.other_settings"]),
        ("fusion_ray.registry", ["fusion_ray", "fusion_ray.checks", "fusion_ray.registry"]),
    ],
)
def test_the_shared_schema_loads_nothing_beyond_the_standard_library(shared, loads):
    """analysis imports ``fusion_ray.schema`` and ``fusion_ray.store_errors``; they must not pull
    in torch, Ray, MLflow or the rest of fusion_ray (the package's ``__init__`` stays
    import-light)."""
    code = (
        f"import sys; before = set(sys.modules); import {shared}; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    stdlib = set(sys.stdlib_module_names)
    loaded = [m for m in proc.stdout.split() if m.split(".")[0] not in stdlib]
    assert sorted(loaded) == loads, loaded


@pytest.mark.unit
def test_every_report_section_is_one_module_with_a_known_place():
    """A report analysis is one module with a ``Section`` and one registration: the registered
    sections have distinct names, each lives in a module of its own, says which part of
    report.md it follows and where its warnings go, and is marked as the study's exactly when
    it lives in ``analysis.sections.study``."""
    from analysis.sections.base import PARTS, WARNING_PLACES, Section
    from analysis.sections.registry import BUILT_IN_SECTIONS, sections

    shown = sections()
    assert shown[: len(BUILT_IN_SECTIONS)] == list(BUILT_IN_SECTIONS)
    assert all(isinstance(s, Section) for s in shown)
    names = [s.name for s in shown]
    modules = [type(s).__module__ for s in shown]
    assert len(set(names)) == len(names) and all(names), names
    assert len(set(modules)) == len(modules), modules
    assert all(s.follows in PARTS for s in shown)
    assert all(s.warns_with in WARNING_PLACES for s in shown)
    study = {s.name: s.study for s in BUILT_IN_SECTIONS}
    placed = {
        s.name: type(s).__module__.startswith("analysis.sections.study.") for s in BUILT_IN_SECTIONS
    }
    assert study == placed


MLFLOW_MODULES = {"fusion_ray.driver.tracking", "fusion_ray.driver.store_faults"}
"""The tracker and the store's faults as the driver meets them: fusion_ray's only MLflow."""


@pytest.mark.unit
def test_tracking_is_the_only_module_of_fusion_ray_that_imports_mlflow():
    """docs/architecture.md: ``fusion_ray.driver.tracking`` owns MLflow (the lease and the Tune
    callbacks write through it; ``store_faults`` tells MLflow's errors from others), at any
    depth, lazy imports included."""
    importers = [
        f"{MODULES[name].relative_to(ROOT)}:{line}: {module}"
        for name in MODULES
        if name.startswith("fusion_ray") and name not in MLFLOW_MODULES
        for module, _, line in _imports(MODULES[name])
        if module.split(".")[0] == "mlflow"
    ]
    assert not importers, "mlflow imported outside the tracking modules:\n" + "\n".join(importers)


APPLICATION = {
    "fusion_ray.api",
    "fusion_ray.cli",
    "fusion_ray.sweep",
    "fusion_ray.hpo.cli",
    "fusion_ray.completion",
}
"""The application layer: the Python API and the commands. Only it joins the engine (trials on
Ray, MLflow) and the analysis (the report); ``fusion_ray.testing``, the plug-in authors' kit,
checks both packages' registries."""
COMMAND_LINE = {
    "fusion_ray.cli",
    "fusion_ray.sweep",
    "fusion_ray.planner",
    "fusion_ray.hpo.cli",
    "fusion_ray.completion",
}
"""The commands; ``python -m`` entry points (``__main__`` modules) run them."""


@pytest.mark.unit
def test_the_engine_reaches_the_analysis_only_through_the_application_layer():
    reaching = [
        f"{MODULES[name].relative_to(ROOT)}:{line}: {module}"
        for name in MODULES
        if name.startswith("fusion_ray")
        and name not in APPLICATION
        and not (name == "fusion_ray.testing" or name.startswith("fusion_ray.testing."))
        for module, _, line in _imports(MODULES[name])
        if module.split(".")[0] == "analysis"
    ]
    assert not reaching, "the engine imports the analysis:\n" + "\n".join(reaching)


@pytest.mark.unit
def test_the_api_is_the_core_the_command_line_calls_not_the_other_way_round():
    below_cli = [name for name in MODULES if name.startswith("fusion_ray")]
    calling_up = [
        f"{MODULES[name].relative_to(ROOT)}:{line}: {module}"
        for name in below_cli
        if name not in COMMAND_LINE and not name.endswith("__main__")
        for module, _, line in _imports(MODULES[name])
        if module in COMMAND_LINE
    ]
    assert not calling_up, "modules below the command line import it:\n" + "\n".join(calling_up)


MODULE_LINES = 520
"""About 500 lines: a module longer than this says at the top of its docstring why it is one."""


@pytest.mark.unit
def test_a_long_module_says_why_it_is_one():
    unexplained = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for path in MODULES.values()
        if (lines := len(path.read_text().splitlines())) > MODULE_LINES
        and "Why one module" not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    assert not unexplained, (
        f"modules over {MODULE_LINES} lines without a 'Why one module' paragraph in their "
        "docstring (cut them along their seams, or say why they are one):\n"
        + "\n".join(unexplained)
    )


LAYERS = {
    # the application layer: the API, the commands and what they print, the plug-in authors' kit
    "fusion_ray.api": 6,
    "fusion_ray.cli": 6,
    "fusion_ray.completion": 6,
    "fusion_ray.sweep": 6,
    "fusion_ray.planner": 6,
    "fusion_ray.console": 6,
    "fusion_ray.hpo": 6,
    "fusion_ray.testing": 6,
    "fusion_ray.launch": 6,  # the files that run a sweep on a cluster
    "fusion_ray.driver": 5,  # running trials on Ray
    "fusion_ray.study": 5,  # the study's sweeps as a workload of the driver (a plug-in of it)
    "fusion_ray.policy": 4,  # which cells run
    "fusion_ray.config": 3,  # the sweep file, the grid and its cells
    "fusion_ray.train": 2,  # one trial, and its typed result
    "fusion_ray.model": 1,
    "fusion_ray.data": 1,
    "fusion_ray.decide": 1,
    "fusion_ray.trainables": 1,  # a training function's contract: what it is given, its registry
    "fusion_ray": 0,  # the package root's small shared modules
}
"""fusion_ray's layers, top to bottom: a module imports only modules of its own layer or below
(the rooms above say which of one layer may import each other). ``__main__`` modules are
entry points and run the commands."""


def _layer(name: str) -> int:
    parts = name.split(".")
    return next(
        LAYERS[".".join(parts[:i])]
        for i in range(len(parts), 0, -1)
        if ".".join(parts[:i]) in LAYERS
    )


@pytest.mark.unit
def test_nothing_imports_upward():
    upward = [
        f"{MODULES[name].relative_to(ROOT)}: {target} (layer {_layer(target)} over {_layer(name)})"
        for name in MODULES
        if name.startswith("fusion_ray") and not name.endswith("__main__")
        for target in sorted(_edges(name))
        if target.startswith("fusion_ray") and _layer(target) > _layer(name)
    ]
    assert not upward, "imports of a layer above:\n" + "\n".join(upward)


ANALYSIS_LAYERS = {
    "analysis": 5,  # the Python API (``analysis/__init__.py``)
    "analysis.report": 4,  # the report: build, report.md, report.html, the CLI
    "analysis.sections": 3,  # the report's sections, the paired core they are given
    "analysis.render": 2,  # escaping, tables, drawing
    "analysis.stats": 1,  # pairing, the statistics, the verdicts
    "analysis.load": 0,  # what was run: MLflow to frames
}
"""analysis's packages by role, top to bottom: a module imports only modules of its own package
or of one below."""


def _analysis_layer(name: str) -> int:
    parts = name.split(".")
    return next(
        ANALYSIS_LAYERS[".".join(parts[:i])]
        for i in range(len(parts), 0, -1)
        if ".".join(parts[:i]) in ANALYSIS_LAYERS
    )


@pytest.mark.unit
def test_analysis_imports_only_downward_by_role():
    upward = [
        f"{MODULES[name].relative_to(ROOT)}: {target} "
        f"(layer {_analysis_layer(target)} over {_analysis_layer(name)})"
        for name in MODULES
        if name.split(".")[0] == "analysis" and not name.endswith("__main__")
        for target in sorted(_edges(name))
        if target.split(".")[0] == "analysis" and _analysis_layer(target) > _analysis_layer(name)
    ]
    assert not upward, "imports of a layer above:\n" + "\n".join(upward)


@pytest.mark.unit
def test_every_module_of_analysis_is_in_a_role():
    """analysis's root holds only the API; every other module is in one of the role packages."""
    loose = sorted(
        str(path.relative_to(ROOT))
        for name, path in MODULES.items()
        if name.split(".")[0] == "analysis"
        and path.parent == ROOT / "analysis"
        and path.name != "__init__.py"
    )
    assert not loose, f"modules at analysis/'s root (put each in its role's package): {loose}"
    roles = {".".join(n.split(".")[:2]) for n in MODULES if n.startswith("analysis.")}
    assert roles == set(ANALYSIS_LAYERS) - {"analysis"}, roles


@pytest.mark.unit
def test_every_package_of_fusion_ray_has_a_layer():
    """A new package says where it sits (a module at the root is a shared one, layer 0, unless
    LAYERS says otherwise)."""
    packages = {
        ".".join(name.split(".")[:2])
        for name, path in MODULES.items()
        if name.startswith("fusion_ray.") and path.parent != ROOT / "fusion_ray"
    }
    assert not sorted(packages - set(LAYERS)), "packages without a layer in LAYERS"


ENGINE = ("fusion_ray.driver", "fusion_ray.policy", "fusion_ray.decide")
"""The engine: it runs any kind of sweep (``fusion_ray.driver.workload``) and knows no study."""
NOT_YET_OUTSIDE_THE_STUDY = {
    "fusion_ray.decide.questions": "its length questions key regimes by the study's dataset "
    "by default and read its test split's length quarters",
}
"""Engine modules that still know the study, each with what it knows."""
STUDY = (
    "fusion_ray.model",
    "fusion_ray.data",
    "fusion_ray.study",
    "fusion_ray.hpo",
    "fusion_ray.config.grid",
    "fusion_ray.config.build",
    "fusion_ray.config.smoke",
    "fusion_ray.train",
)
"""The study's modules: its encoder, data, trial, HPO phase, and its sweep file's grid."""
STUDY_NAMES = {"SweepSpec", "Cell", "TrialConfig", "FUSIONS", "POSITIONS", "DatasetPreset"}
PROTOCOL = ("fusion_ray.train.result",)
"""What crosses back from any trial: the result keys every kind of trial reports."""


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@pytest.mark.unit
def test_the_engine_imports_nothing_of_the_study():
    """The driver, the policies and the decision code reach a sweep only through its spec's
    adapter (``config.workload``) and its workload (``driver.workload``: the study's is the
    plug-in ``fusion_ray.study``): no import of the study's modules or names, at any depth,
    type hints included (beyond the modules that say what they still know)."""
    reaching = [
        f"{MODULES[name].relative_to(ROOT)}:{line}: {module} {sorted(set(names) & STUDY_NAMES)}"
        for name in MODULES
        if name.startswith(ENGINE) and name not in NOT_YET_OUTSIDE_THE_STUDY
        for module, names, line in _imports(MODULES[name])
        if (_within(module, STUDY) and not _within(module, PROTOCOL)) or set(names) & STUDY_NAMES
    ]
    assert not reaching, "the engine imports the study:\n" + "\n".join(reaching)
    assert all(name in MODULES for name in NOT_YET_OUTSIDE_THE_STUDY)


@pytest.mark.unit
@pytest.mark.parametrize("room", ["fusion_ray.policy", "fusion_ray.decide", "fusion_ray.train"])
def test_the_policies_the_decisions_and_the_trial_import_nothing_of_the_driver(room):
    """At any depth, type hints included: the policies write through their own protocols."""
    reaching = [
        f"{MODULES[name].relative_to(ROOT)}:{line}: {module}"
        for name in MODULES
        if name == room or name.startswith(room + ".")
        for module, _, line in _imports(MODULES[name])
        if module == "fusion_ray.driver" or module.startswith("fusion_ray.driver.")
    ]
    assert not reaching, f"{room} imports the driver:\n" + "\n".join(reaching)


@pytest.mark.unit
def test_tracking_only_talks_to_mlflow():
    """Checkpoint and result paths are ``fusion_ray.driver.storage``'s; the tracking module
    records what it is given and imports nothing of the driver's other modules but the store's
    faults (``store_faults``, which imports only the store checks, ``preflight``)."""
    driver = {
        module
        for module, _, _ in _imports(MODULES["fusion_ray.driver.tracking"])
        if module.startswith("fusion_ray.driver.")
    }
    assert driver <= {"fusion_ray.driver.store_faults"}, driver
    faults = {
        module
        for module, _, _ in _imports(MODULES["fusion_ray.driver.store_faults"])
        if module.startswith("fusion_ray.driver.")
    }
    assert faults <= {"fusion_ray.driver.preflight"}, faults


def _function_imports(path: Path) -> list[tuple[int, bool]]:
    """(line, whether a ``# lazy:`` comment says why) of each import of the project's packages
    inside a function (``TYPE_CHECKING`` blocks are not functions)."""
    lines = path.read_text().splitlines()
    found = []
    for func in ast.walk(ast.parse(path.read_text())):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = [n for stmt in func.body for n in ast.walk(stmt)]
        imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in imports:
            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            if (module or "").split(".")[0] not in PACKAGES:
                continue
            above = lines[max(node.lineno - 8, 0) : node.lineno - 1]
            said = any(line.strip().startswith("# lazy:") for line in above)
            found.append((node.lineno, said))
    return found


@pytest.mark.unit
def test_an_import_inside_a_function_says_why():
    """The project's imports sit at the top of a module, where readers and tools see its real
    dependencies; one inside a function (a measured start-up cost) has a ``# lazy:`` comment just
    above it saying which."""
    unexplained = [
        f"{path.relative_to(ROOT)}:{line}"
        for name, path in MODULES.items()
        if name.startswith("fusion_ray")
        for line, said in _function_imports(path)
        if not said
    ]
    assert not unexplained, (
        "imports inside functions without a '# lazy:' comment saying why (move them to the "
        "top, or say which start-up cost or optional dependency keeps them there):\n"
        + "\n".join(unexplained)
    )
