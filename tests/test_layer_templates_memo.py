"""Templates.layer (a layer's (forward, backward) templates looked up once per layer) against the long way it
replaces: self.of(layer_kind(model, layer, run)), the same Template objects, for every layer of library
scenarios whose layers differ in kind (dense then MoE layers, MLA, sliding windows alternating, 16-bit first
and last layers under FP8), plain models, and MTP depths (layer ids past the decoder's); asked in a
scrambled order, each layer twice, so a memo keyed on anything but the layer would hand back another kind."""

from __future__ import annotations

import random

import pytest

from meshsim.scenarios.load import load_scenario, resolve
from meshsim.sim.schedule.builder import step_templates
from meshsim.sim.schedule.layer_kinds import layer_kind
from meshsim.sim.schedule.mtp_ops import mtp_layer_ids
from meshsim.sim.schedule.shapes import layer_dims

CASES = ["deepseek-v3-h100-ep64", "gpt-oss-120b-h100-pp4-ep8", "llama3-8b-h100-fp8", "mixtral-8x7b-h100-ep8",
         "llama2-70b-h100-tp8", "llama3-8b-gb300-nvfp4"]


@pytest.mark.parametrize("name", CASES)
def test_layer_templates_are_the_kinds_templates(name):
    rs = resolve(*load_scenario(name))
    m = rs.scenario.model
    t = step_templates(rs, layer_dims(rs), tied=False)
    layers = list(range(m.layers)) + list(mtp_layer_ids(m))
    order = layers * 2
    random.Random(0).shuffle(order)
    kinds = set()
    for layer in order:
        fwd, bwd = t.layer_fwd(layer), t.layer_bwd(layer)
        if t.model is None:
            assert (fwd, bwd) == (t.fwd, t.bwd) and fwd is t.fwd and bwd is t.bwd
            continue
        kind = layer_kind(t.model, layer, t.run)
        kinds.add(kind)
        want = t.of(kind)
        assert fwd is want[0] and bwd is want[1]
    if name == "deepseek-v3-h100-ep64":  # negative control: dense and MoE layers are two kinds, two templates
        assert len(kinds) == 2 and t.layer_fwd(0) is not t.layer_fwd(m.layers - 1)
