"""Section defaults (scenarios/model_schema.py defaults_of): a section a file leaves out is the section with every
field at its default, equal in every way a reader can see to `Section()`, and defining the schema builds no
validator (start-up: each is built when a scenario first validates)."""

import subprocess
import sys

import pytest

from meshsim.scenarios.profile import HardwareProfile
from meshsim.scenarios.releases import ReleaseProfile
from meshsim.scenarios.schema import Frozen, HardwareConfig, Scenario, TopologyConfig

MODELS = (Scenario, HardwareConfig, TopologyConfig, HardwareProfile, ReleaseProfile)
SECTION_FIELDS = [(model, name) for model in MODELS for name, f in model.model_fields.items()
                  if f.default_factory is not None and isinstance(f.annotation, type)
                  and issubclass(f.annotation, Frozen)]


def test_every_section_default_is_made_by_defaults_of():
    names = {(m.__name__, n) for m, n in SECTION_FIELDS}
    assert {("Scenario", "hardware"), ("Scenario", "run"), ("Scenario", "optimizer"), ("HardwareConfig", "compute"),
            ("HardwareConfig", "network"), ("TopologyConfig", "fabric"), ("HardwareProfile", "gpu"),
            ("ReleaseProfile", "compute")} <= names


@pytest.mark.parametrize(("model", "name"), SECTION_FIELDS, ids=lambda x: getattr(x, "__name__", x))
def test_section_default_equals_the_validated_default(model, name):
    section = model.model_fields[name].annotation
    made, validated = model.model_fields[name].default_factory(), section()
    assert type(made) is section
    assert made == validated and hash(made) == hash(validated)
    assert made.model_fields_set == validated.model_fields_set == set()
    assert made.model_dump() == validated.model_dump()
    assert made.model_dump_json() == validated.model_dump_json()
    assert made.model_dump(exclude_defaults=True) == validated.model_dump(exclude_defaults=True) == {}


def test_a_left_out_section_dumps_as_before():
    """A scenario without hardware / run / optimizer: the same dump, default or spelled out."""
    base = {"name": "t", "model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 128, "vocab": 256},
            "topology": {"preset": "dgx-h100"}, "parallel": {"global_batch": 8}}
    spelled = {**base, "hardware": {"compute": {}, "network": {}}, "run": {}, "optimizer": {},
               "topology": {"preset": "dgx-h100", "fabric": {}}}
    left, full = Scenario.model_validate(base), Scenario.model_validate(spelled)
    assert left == full and left.model_dump() == full.model_dump()
    assert left.model_dump(exclude_unset=True) == base


def test_defining_the_schema_builds_no_validator():
    code = ("import pydantic, meshsim.scenarios.schema as s, meshsim.scenarios.model_schema as ms, "
            "meshsim.scenarios.profile as p, meshsim.topologies.custom as c\n"
            "built = [m.__name__ for mod in (s, ms, p, c) for m in vars(mod).values() if isinstance(m, type) and "
            "issubclass(m, pydantic.BaseModel) and m.__module__ == mod.__name__ and m.__pydantic_complete__]\n"
            "print(','.join(built))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
