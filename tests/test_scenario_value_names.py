"""Other tools' names for enumerated values (scenarios/value_names.py): every value the table points to is
one its fields accept, a refused other name gets a fix naming meshsim's value, and applying that fix loads;
values the table does not know keep the generic fix (negative control)."""

from __future__ import annotations

from typing import Literal, get_args, get_origin

import pytest
from pydantic import BaseModel

from meshsim.scenarios.load import load_scenario, with_overrides
from meshsim.scenarios.schema import Scenario
from meshsim.scenarios.value_names import OTHER_NAMES, other_name_fix
from meshsim.sim.cli.main import main
from meshsim.sim.core.errors import UserError


def _literals(annotation: object) -> set[str]:
    if get_origin(annotation) is Literal:
        return {a for a in get_args(annotation) if isinstance(a, str)}
    return set().union(*(_literals(a) for a in get_args(annotation))) if get_args(annotation) else set()


def _accepted(model: type[BaseModel], name: str, seen: set | None = None) -> set[str]:
    """The string values every field called `name`, in any section of `model`, accepts."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    out: set[str] = set()
    for field_name, field in model.model_fields.items():
        if field_name == name:
            out |= _literals(field.annotation)
        for sub in _models(field.annotation):
            out |= _accepted(sub, name, seen)
    return out


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models(a)]


@pytest.mark.parametrize("field", sorted(OTHER_NAMES))
def test_every_value_the_table_names_is_accepted_and_no_other_name_is_a_value(field):
    accepted = _accepted(Scenario, field)
    assert accepted, f"no scenario field is called {field}"
    for other, (meant, _) in OTHER_NAMES[field].items():
        assert meant in accepted, (field, other, meant)
        assert other not in accepted, (field, other)  # an accepted value is never rewritten


OVERRIDES = {
    "run.fp8": ("current", "tensorwise"),
    "parallel.moe_dispatcher": ("DeepEP", "flex"),
    "model.mlp": ("silu", "swiglu"),
    "model.attention": ("cudnn", "flash"),
    "model.dtype": ("bfloat16", "bf16"),
    "parallel.recompute": ("off", "none"),
}


@pytest.mark.parametrize("field", sorted(OVERRIDES))
def test_a_refused_other_name_names_the_value_and_the_fix_loads(field):
    scenario, source = load_scenario("mixtral-8x7b-h100-ep8")
    other, meant = OVERRIDES[field]
    with pytest.raises(UserError) as info:
        with_overrides(scenario, {field: other}, source)
    assert f"Fix: set {field} to {meant!r}" in str(info.value)
    assert getattr(getattr(with_overrides(scenario, {field: meant}, source), field.split(".")[0]),
                   field.split(".")[1]) == meant


def test_unknown_values_keep_the_generic_fix():
    scenario, source = load_scenario("tiny-2gpu")
    with pytest.raises(UserError) as info:
        with_overrides(scenario, {"run.fp8": "fp9"}, source)
    assert "Fix: set run.fp8 to one of 'off', 'delayed'" in str(info.value)
    assert other_name_fix("run.fp8", 8) is None and other_name_fix("model.heads", "silu") is None
    assert other_name_fix("sweep.fp8[1]", " CS ") == ("set sweep.fp8[1] to 'tensorwise' (FP8 with per-tensor current "
                                                      "scaling: Megatron-Bridge's FP8-CS, Megatron-LM's --fp8-recipe "
                                                      "tensorwise)")


def test_the_cli_prints_it_on_one_line_and_exits_2(tmp_path, capsys):
    text = "name: t\nmodel: {layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 1024}\n" \
           "topology: {preset: dgx-h100}\nparallel: {gpus: 2, tp: 2, micro_batch: 2, global_batch: 4}\n" \
           "run: {fp8: FP8-CS}\n"
    path = tmp_path / "s.yaml"
    path.write_text(text)
    assert main(["run", str(path), "--outputs", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "set run.fp8 to 'tensorwise'" in err[0] and "Traceback" not in err[0]


def test_sweep_axes_name_the_value_too():
    from meshsim.sim.sweep.axes import parse_fp8, parse_recompute

    with pytest.raises(UserError) as info:
        parse_fp8("off,FP8-MX")
    assert "Fix: write 'mxfp8' for 'fp8-mx' (Megatron-Bridge's FP8-MX" in str(info.value)
    with pytest.raises(UserError) as info:
        parse_recompute("off,full")
    assert "Fix: write 'none' for 'off', or use a comma-separated subset of none, selective, full" in str(info.value)
    with pytest.raises(UserError) as info:  # negative control: no other name, the generic fix alone
        parse_fp8("fp9")
    assert "Fix: use a comma-separated subset of off" in str(info.value)
    assert parse_fp8("off,mxfp8") == ("off", "mxfp8")


def _field_exists(path: str) -> bool:
    model: type[BaseModel] | None = Scenario
    for part in path.split("."):
        if model is None or part not in model.model_fields:
            return False
        subs = _models(model.model_fields[part].annotation)
        model = subs[0] if subs else None
    return True


def test_every_megatron_key_points_to_a_scenario_field():
    from meshsim.scenarios.value_names import MEGATRON_KEYS

    assert all(_field_exists(path) for path in MEGATRON_KEYS.values()), \
        [path for path in MEGATRON_KEYS.values() if not _field_exists(path)]
    assert not _field_exists("parallel.tensor_model_parallel_size")  # the control: the walk can say no


@pytest.mark.parametrize("section, key, fix", [
    ("parallel", "tensor_model_parallel_size", "write it as parallel.tp (Megatron-LM's --tensor-model-parallel-size"),
    ("parallel", "expert-model-parallel-size", "write it as parallel.ep (Megatron-LM's --expert-model-parallel-size"),
    ("model", "num_experts", "write it as model.moe.experts (Megatron-LM's --num-experts"),
    ("parallel", "tpp", "did you mean 'tp'? valid keys in section parallel"),  # not a Megatron name: as before
])
def test_a_megatron_argument_written_as_a_key_names_the_field(section, key, fix):
    scenario, source = load_scenario("tiny-2gpu")
    data = scenario.model_dump(mode="python", exclude_unset=True)
    data[section][key] = 2
    from meshsim.scenarios.load import validate_scenario

    with pytest.raises(UserError) as info:
        validate_scenario(data, source)
    assert f"Unknown key {key!r} in section {section}. Fix: {fix}" in str(info.value)


@pytest.mark.parametrize("field, value, meant", [("model.norm", "RMSNorm", "rmsnorm"), ("run.fp8", "MXFP8", "mxfp8"),
                                                 ("model.mlp", "SwiGLU", "swiglu")])
def test_a_value_in_another_case_names_the_lower_case_one(field, value, meant):
    scenario, source = load_scenario("tiny-2gpu")
    with pytest.raises(UserError) as info:
        with_overrides(scenario, {field: value}, source)
    assert f"Fix: set {field} to {meant!r} (values are lower case)" in str(info.value)


def test_an_unquoted_yaml_off_names_the_quoted_value(tmp_path, capsys):
    """YAML 1.1 reads `fp8: off` and `recompute: off` as false: the fix names the string the field takes."""
    base = "name: t\nmodel: {layers: 2, hidden: 256, heads: 4, seq_len: 128, vocab: 1024}\n" \
           "topology: {preset: dgx-h100}\nparallel: {gpus: 2, tp: 2, micro_batch: 2, global_batch: 4%s}\n%s"
    for extra, run, fix in ((", recompute: off", "", "set parallel.recompute to 'none' (YAML reads an unquoted"),
                            ("", "run: {fp8: off}\n", "set run.fp8 to 'off' (YAML reads an unquoted off as false")):
        path = tmp_path / "s.yaml"
        path.write_text(base % (extra, run))
        assert main(["run", str(path), "--outputs", "none"]) == 2
        assert fix in capsys.readouterr().err
    assert other_name_fix("run.fp8", True) is None  # `on` has no single meaning: the generic fix
