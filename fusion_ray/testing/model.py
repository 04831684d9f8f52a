"""Contract checks for the model registries: fusion operators (``FUSIONS``), input-level
positions (``POSITIONS``) and attention-level positions (``ATTENTION_POSITIONS``).

Each check builds a tiny classifier (``d_model`` 8, 2 heads, 2 layers, ``max_len`` 16) with the
entry and its options, and raises ``AssertionError`` naming the entry and what broke:

- shapes: the entry's own output (H for a fusion, P for a position) and the logits;
- gradient flow: every parameter of the model gets a finite, non-zero gradient;
- determinism on CPU: the same seed twice gives identical parameters, logits (dropout on) and
  parameters after one optimiser step;
- paired initialisation: for one seed, every parameter outside the entry's own submodule is
  byte-identical to the model without it (the paired-seed protocol: a comparison of two
  operators differs in the operator only);
- the settings check (``check_model_spec``) accepts the entry with its options;
- the entry runs with every entry of the other two model registries (finite logits);
- an entry registered ``same_as`` another starts from the same values and computes the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from fusion_ray.model import (
    ATTENTION_POSITIONS,
    FUSIONS,
    POSITIONS,
    ModelSpec,
    build_classifier,
    check_model_spec,
)

AXES = ("fusion", "position", "attention_position")
"""The model settings a registry entry is chosen by (``model.<axis>`` and ``<axis>_kwargs``)."""
VOCAB, CLASSES, MAX_LEN = 50, 3, 16
TINY: dict[str, Any] = dict(d_model=8, n_heads=2, n_layers=2, d_ff=16, dropout=0.1, max_len=16)
"""The model settings of every check; a check's ``model`` argument overrides them."""
OWN_SUBMODULE = {
    "fusion": ("fusion.",),
    "position": ("position.",),
    "attention_position": ("encoder.attention_position.",),
}
"""Where each axis's parameters live in the classifier; everything else is shared."""


def _registry(axis: str):
    if axis not in AXES:
        raise ValueError(f"axis {axis!r}: choose one of {', '.join(AXES)}")
    return {"fusion": FUSIONS, "position": POSITIONS, "attention_position": ATTENTION_POSITIONS}[
        axis
    ]


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the body on one CPU thread (tiny models are faster so), restoring the count after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def tiny_spec(
    axis: str | None = None,
    name: str | None = None,
    options: Mapping[str, Any] | None = None,
    model: Mapping[str, Any] | None = None,
):
    """The check's ``ModelSpec``: ``TINY`` with ``model`` over it and the entry on its axis."""
    settings = {**TINY, **(model or {})}
    if axis is not None:
        _registry(axis)
        settings[axis] = name
        settings[f"{axis}_kwargs"] = dict(options or {})
    return ModelSpec(**settings)


def tiny_batch(seed: int = 0):
    """Two documents of lengths 10 and 6, right-padded with 0 to 10: (ids [2, 10], mask [2, 10])."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (2, 10), generator=g)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False
    ids[~mask] = 0
    return ids, mask


def _build(spec, seed: int = 0):
    return build_classifier(spec, VOCAB, CLASSES, seed=seed)


def _label(axis: str, name: str) -> str:
    return f"{axis.replace('_', ' ')} {name!r}"


def shared_parameters(model, exclude: tuple[str, ...]) -> dict[str, Any]:
    """The model's parameters, without those whose names start with one of ``exclude``."""
    return {n: p.detach() for n, p in model.named_parameters() if not n.startswith(exclude)}


def assert_byte_identical(a: Mapping[str, Any], b: Mapping[str, Any], what: str = "") -> None:
    """Two name -> tensor mappings hold the same names, dtypes, shapes and bytes."""
    assert a.keys() == b.keys(), f"{what}: parameters differ: {sorted(set(a) ^ set(b))}"
    for name in a:
        same = a[name].dtype == b[name].dtype and a[name].shape == b[name].shape
        assert same, f"{what}: {name} has another dtype or shape"
        assert a[name].numpy().tobytes() == b[name].numpy().tobytes(), (
            f"{what}: {name} is not byte-identical"
        )


def check_spec_accepted(axis: str, name: str, options=None, model=None) -> None:
    """``check_model_spec`` finds no problem with the entry and its options."""
    problems = check_model_spec(tiny_spec(axis, name, options, model))
    assert problems == [], f"{_label(axis, name)}: the settings check refuses it: {problems}"


def check_fusion_shapes(name: str, options=None, d_model: int = 8) -> None:
    """H has E's shape [B, L, d] for P shared by the batch ([L, d]) and per document ([B, L, d])."""
    with one_thread():
        fusion = FUSIONS.build(name, d_model, **dict(options or {}))
        E = torch.randn(3, 5, d_model)
        for P in (torch.randn(5, d_model), torch.randn(3, 5, d_model)):
            H = fusion(E, P)
            assert H.shape == (3, 5, d_model), (
                f"fusion {name!r}: H has shape {tuple(H.shape)} for E {tuple(E.shape)} and P "
                f"{tuple(P.shape)}; it must be {tuple(E.shape)}"
            )


def check_position_shapes(name: str, options=None, d_model: int = 8) -> None:
    """P is [L, d] for any length up to ``max_len``."""
    with one_thread():
        position = POSITIONS.build(name, d_model, MAX_LEN, **dict(options or {}))
        for length in (5, MAX_LEN):
            P = position(length, torch.device("cpu"))
            assert P.shape == (length, d_model), (
                f"position {name!r}: P has shape {tuple(P.shape)} for length {length}; it must "
                f"be ({length}, {d_model})"
            )


def check_gradients(axis: str, name: str, options=None, model=None) -> None:
    """Logits [B, classes], and every parameter gets a finite, non-zero gradient."""
    spec = tiny_spec(axis, name, options, model)
    with one_thread():
        classifier = _build(spec)
        ids, mask = tiny_batch()
        logits = classifier(ids, mask)
        assert logits.shape == (2, CLASSES), f"{_label(axis, name)}: logits {tuple(logits.shape)}"
        logits.square().sum().backward()
        for pname, p in classifier.named_parameters():
            where = f"{_label(axis, name)}: parameter {pname}"
            assert p.grad is not None, f"{where} gets no gradient"
            assert torch.isfinite(p.grad).all(), f"{where} has a non-finite gradient"
            assert p.grad.abs().sum() > 0, f"{where} has an all-zero gradient"


def check_determinism(axis: str, name: str, options=None, model=None) -> None:
    """Same seed twice: identical parameters, outputs (dropout on) and one optimiser step."""
    results = []
    with one_thread():
        for _ in range(2):
            classifier = _build(tiny_spec(axis, name, options, model), seed=3)
            optimiser = torch.optim.AdamW(classifier.parameters(), lr=1e-2)
            ids, mask = tiny_batch()
            torch.manual_seed(11)  # dropout
            logits = classifier(ids, mask)
            logits.logsumexp(-1).sum().backward()
            optimiser.step()
            state = {k: v.clone() for k, v in classifier.state_dict().items()}
            results.append((logits.detach(), state))
    assert torch.equal(results[0][0], results[1][0]), (
        f"{_label(axis, name)}: the same seed gave different logits"
    )
    assert_byte_identical(results[0][1], results[1][1], f"{_label(axis, name)}, same seed twice")


def _outside(classifier, exclude: tuple[str, ...]) -> list[tuple[str, str]]:
    return [
        (n, type(m).__name__)
        for n, m in classifier.named_modules()
        if n and not any(f"{n}.".startswith(prefix) for prefix in exclude)
    ]


def _pairing_contexts(axis: str) -> list[dict[str, str]]:
    """The settings of the other axes a paired initialisation is checked under."""
    if axis == "fusion":
        return [
            {"position": "sinusoidal", "attention_position": "none"},
            {"position": "learned", "attention_position": "t5_bias"},
        ]
    other = "attention_position" if axis == "position" else "position"
    return [{other: entry} for entry in _registry(other).names()]


def check_paired_init(axis: str, name: str, options=None, model=None, seeds=(0, 1)) -> None:
    """For each seed, every parameter outside the entry's own submodule is byte-identical to
    that of the model with the default entries (``add``, ``sinusoidal``, ``none``), and nothing
    of a fusion operator lives outside ``.fusion``. A fusion is checked under two position
    settings; a position under every entry of the other position axis."""
    exclude = OWN_SUBMODULE[axis] if axis == "fusion" else sum(OWN_SUBMODULE.values(), ())
    with one_thread():
        for seed, context in itertools.product(seeds, _pairing_contexts(axis)):
            settings = {**(model or {}), **context}
            reference = _build(tiny_spec(model=settings), seed=seed)
            built = _build(tiny_spec(axis, name, options, settings), seed=seed)
            what = f"{_label(axis, name)} vs the defaults, seed {seed}, {context}"
            assert_byte_identical(
                shared_parameters(reference, exclude), shared_parameters(built, exclude), what
            )
            if axis == "fusion":
                assert _outside(built, exclude) == _outside(reference, exclude), (
                    f"{what}: the operator adds submodules outside .fusion"
                )


def check_every_combination(axis: str, name: str, options=None, model=None) -> None:
    """The entry with every entry of the other two model registries: finite logits."""
    others = [a for a in AXES if a != axis]
    ids, mask = tiny_batch()
    with one_thread():
        for first, second in itertools.product(*(_registry(a).names() for a in others)):
            settings = {**(model or {}), others[0]: first, others[1]: second, "n_layers": 1}
            spec = tiny_spec(axis, name, options, settings)
            classifier = _build(spec).eval()
            with torch.no_grad():
                assert torch.isfinite(classifier(ids, mask)).all(), (
                    f"{_label(axis, name)} with {others[0]} {first!r} and {others[1]} "
                    f"{second!r}: non-finite logits"
                )


def check_same_as(axis: str, name: str, options=None, model=None) -> None:
    """An entry registered ``same_as`` another: the same initial values (by position in the
    parameter list) and the same logits for one seed. Nothing to check for other entries."""
    alias = _registry(axis).same_as(name)
    if alias is None:
        return
    with one_thread():
        a = _build(tiny_spec(axis, name, options, model)).eval()
        b = _build(tiny_spec(axis, alias, options, model)).eval()
        values_a = [p.detach() for p in a.parameters()]
        values_b = [p.detach() for p in b.parameters()]
        assert len(values_a) == len(values_b) and all(
            torch.equal(x, y) for x, y in zip(values_a, values_b, strict=True)
        ), f"{_label(axis, name)} is registered as {alias!r} but starts from other values"
        ids, mask = tiny_batch()
        with torch.no_grad():
            assert torch.equal(a(ids, mask), b(ids, mask)), (
                f"{_label(axis, name)} is registered as {alias!r} but computes other logits"
            )


def _check_entry(axis: str, name: str, options, model) -> None:
    assert name in _registry(axis), f"{_label(axis, name)} is not registered (is it installed?)"
    check_spec_accepted(axis, name, options, model)
    check_gradients(axis, name, options, model)
    check_determinism(axis, name, options, model)
    check_paired_init(axis, name, options, model)
    check_same_as(axis, name, options, model)
    check_every_combination(axis, name, options, model)


def check_fusion(name: str, options: Mapping[str, Any] | None = None, model=None) -> None:
    """Every contract check of a fusion operator registered as ``name`` (``options``: its
    keyword options, as under ``model.fusion_kwargs``; ``model``: settings over ``TINY``)."""
    check_fusion_shapes(name, options, d_model={**TINY, **(model or {})}["d_model"])
    _check_entry("fusion", name, options, model)


def check_position(name: str, options: Mapping[str, Any] | None = None, model=None) -> None:
    """Every contract check of an input-level position signal registered as ``name``."""
    check_position_shapes(name, options, d_model={**TINY, **(model or {})}["d_model"])
    _check_entry("position", name, options, model)


def check_attention_position(
    name: str, options: Mapping[str, Any] | None = None, model=None
) -> None:
    """Every contract check of an attention-level position registered as ``name``."""
    _check_entry("attention_position", name, options, model)
