"""declare.setting: a dataclass field that carries its key's JSON schema keywords, description and
whether the file may leave it out; not_a_key marks typed fields that are no key of the file."""

from dataclasses import MISSING, dataclass, fields

import pytest

from acoustic_mlm import declare
from acoustic_mlm.config import schema


@dataclass(frozen=True)
class Section:
    name: str = declare.not_a_key()
    size: int = declare.setting(minimum=1, doc="how many")
    kind: str = declare.setting("a", optional=True, enum=("a", "b"))
    pairs: tuple[int, int] = declare.setting((1, 2), optional=True, items={"minimum": 0})


def test_a_setting_is_a_field_with_its_declaration():
    f = {f.name: f for f in fields(Section)}
    assert f["size"].default is MISSING and f["size"].metadata[declare.SCHEMA] == {"minimum": 1}
    assert f["size"].metadata[declare.DOC] == "how many" and declare.OPTIONAL not in f["size"].metadata
    assert f["kind"].default == "a" and f["kind"].metadata[declare.OPTIONAL] is True
    assert f["name"].metadata[declare.NOT_A_KEY] is True
    with pytest.raises(TypeError, match="size"):
        Section(name="x")  # a required key stays required in the dataclass too
    assert Section(name="x", size=3).kind == "a"


def test_the_schema_of_a_declared_section():
    assert schema.of_dataclass(Section) == {
        "type": "object",
        "additionalProperties": False,
        "required": ["size"],
        "properties": {
            "size": {"type": "integer", "minimum": 1, "description": "how many"},
            "kind": {"enum": ("a", "b")},  # an enum stands in for the type (the file's JSON holds a list)
            "pairs": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": 0}},
        },
    }


def test_a_type_without_a_json_schema_is_refused():
    @dataclass
    class Odd:
        when: complex = declare.setting()

    with pytest.raises(TypeError, match="no JSON schema"):
        schema.of_dataclass(Odd)
