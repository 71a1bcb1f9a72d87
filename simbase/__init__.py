"""simbase: the small base that aisim's libraries share; it imports nothing of the project.

It holds what every layer needs and no layer owns: the one error type (:class:`AisimError`, as
data), SI units and their parsers, atomic result files and JSON reading, the yes/no and list
parsers, and the package version (read once, from the installed metadata).
"""

from simbase import units
from simbase.errors import AisimError, bad_value, suggest
from simbase.io import (
    TABLE_SUFFIXES,
    atomic_write_bytes,
    atomic_write_text,
    check_table_suffix,
    jsonable,
    read_json,
    read_text,
    to_json,
    write_table,
)
from simbase.parse import bool_word, parse_bool, parse_int_list, split_list
from simbase.version import version

__all__ = [
    "TABLE_SUFFIXES",
    "AisimError",
    "atomic_write_bytes",
    "atomic_write_text",
    "bad_value",
    "bool_word",
    "check_table_suffix",
    "jsonable",
    "parse_bool",
    "parse_int_list",
    "read_json",
    "read_text",
    "split_list",
    "suggest",
    "to_json",
    "units",
    "version",
    "write_table",
]
