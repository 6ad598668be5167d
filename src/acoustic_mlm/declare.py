"""One declaration per configuration key: `setting(...)` is a dataclass field that also states what
the configuration file may hold there (JSON schema keywords beyond the field's type: bounds, enums,
patterns) and, where one is due, its description. config/schema.py reads these fields to write the JSON
schema; the dataclasses (config/sections.py, model/config.py) are the only place a key is declared.

Standard library only, outside acoustic_mlm.config: the model's configuration declares its keys with
it and imports nothing from acoustic_mlm.config.
"""

from __future__ import annotations

from dataclasses import MISSING, field

# The metadata keys config/schema.py reads.
SCHEMA = "schema"  # JSON schema keywords merged into what the field's type gives (nested dicts merge too)
REPLACE = "schema_replace"  # a whole JSON schema for the key, used as it is (the type says nothing useful)
DOC = "description"  # the key's description in the schema and docs/configuration.md
OPTIONAL = "optional"  # the file may leave the key out (the field's default applies)
NOT_A_KEY = "not_a_key"  # a typed field the file does not hold (where the value comes from, its name)


def setting(
    default=MISSING,
    *,
    doc: str | None = None,
    optional: bool = False,
    replace: dict | None = None,
    **schema,
):
    """A dataclass field declaring one key of the configuration file.

    `schema` holds JSON schema keywords added to those the field's type gives (`minimum=1`,
    `enum=NORMS`, `items={"minimum": 1}`); an `enum` or `const` stands in for the type. `optional`
    keys may be left out of the file (give them a default); `replace` is the key's whole schema when the
    typed field holds the file's value in another shape.
    """
    metadata: dict = {SCHEMA: schema}
    if doc is not None:
        metadata[DOC] = doc
    if optional:
        metadata[OPTIONAL] = True
    if replace is not None:
        metadata[REPLACE] = replace
    return field(default=default, metadata=metadata)


def not_a_key(default=MISSING, **kwargs):
    """A typed field that is not a key of the file (the file's name, an arm's name, the mapping)."""
    return field(default=default, metadata={NOT_A_KEY: True}, **kwargs)
