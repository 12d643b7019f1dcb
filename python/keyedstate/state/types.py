"""Type information for state and outputs, named as in PyFlink (``pyflink.common.typeinfo``).

A type is declared once, as a ``Types.*()`` value, a Python type (``int``, ``list[str]``,
``dict[str, float]``, ``tuple[int, str]``, ``datetime.datetime`` ...) or a Spark ``DataType``.
Each maps to a Spark SQL type (``TypeInformation.spark_type()``) and checks the values written
to state: a value of the wrong type raises :class:`StateTypeError` naming the state and the type.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import numbers
import operator
import types as pytypes
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyspark.sql import Row
from pyspark.sql import types as T

from keyedstate.errors import KeyedStateError

__all__ = [
    "StateTypeError",
    "named_row",
    "row_class",
    "checker",
    "TypeInformation",
    "Types",
    "compile_exact_all",
    "python_type_name",
    "to_type_info",
]

_LONG = (-(2**63), 2**63 - 1)
_INT = (-(2**31), 2**31 - 1)
_SHORT = (-(2**15), 2**15 - 1)
_BYTE = (-(2**7), 2**7 - 1)


class StateTypeError(KeyedStateError, TypeError):
    """A value does not match the declared type of a state, an output column or a key (or a
    type cannot be declared). Raised in Python, so ``error_id`` is ``None``."""


@functools.lru_cache(maxsize=256)
def row_class(names: tuple[str, ...]) -> type[Row]:
    """The class of ``ROW_NAMED`` values with these field names: a pyspark ``Row`` (a tuple)
    whose fields are also attributes of the class.

    ``Row`` looks a field up by name only when nothing else has the name, so a field named like
    a tuple method (``count``, ``index``: Flink's CountWithTimeoutFunction keeps a ``count``)
    read as the method. Here every field wins, except Row's own ``asDict`` and dunder names
    (reached as ``row["asDict"]``). Instances pickle by field names and values."""
    namespace: dict[str, Any] = {
        "__fields__": list(names),
        "__module__": __name__,
        "__reduce__": lambda self: (named_row, (names, tuple(self))),
    }
    for position, name in enumerate(names):
        if not name.startswith("__") and name not in vars(Row):
            namespace[name] = property(operator.itemgetter(position), doc=f"field {name!r}")
    return type("Row", (Row,), namespace)


def named_row(names: tuple[str, ...], values: Sequence[Any]) -> Row:
    """A ``ROW_NAMED`` value: ``values`` in :func:`row_class` of ``names``."""
    return tuple.__new__(row_class(names), values)


def python_type_name(value: object) -> str:
    return type(value).__name__


class TypeInformation:
    """A declared type: its Spark SQL type and a check/normalisation of Python values.

    ``coerce(value)`` returns the value to store (numpy scalars become Python scalars, ints
    become floats for floating types, tuples become lists for list types) or raises
    :class:`StateTypeError`.
    """

    __slots__ = ("_name", "_spark", "_coerce", "_children", "_exact")

    def __init__(
        self,
        name: str,
        spark_type: T.DataType,
        coerce: Callable[[Any], Any],
        children: tuple[TypeInformation, ...] = (),
        exact: Callable[[str, int], str | None] | None = None,
    ) -> None:
        self._name = name
        self._spark = spark_type
        self._coerce = coerce
        self._children = children
        self._exact = exact

    def exact_check_source(self, var: str, depth: int = 0) -> str | None:
        """A Python expression that is True when ``var`` already is a value of this type in its
        stored form (no conversion needed), or None when there is no such fast test."""
        return None if self._exact is None else self._exact(var, depth)

    def spark_type(self) -> T.DataType:
        """The Spark SQL type values of this type map to."""
        return self._spark

    def coerce(self, value: Any, what: str = "value") -> Any:  # noqa: ANN401 - any declared type
        try:
            return self._coerce(value)
        except StateTypeError as error:
            raise StateTypeError(f"{what}: {error}") from None

    @property
    def children(self) -> tuple[TypeInformation, ...]:
        return self._children

    def is_pickled(self) -> bool:
        return self._name == "PICKLED_BYTE_ARRAY"

    def is_immutable(self) -> bool:
        """Whether values of this type, once checked, cannot change in place (scalars, and
        tuples and rows of them)."""
        if self._name in ("LIST", "MAP", "PRIMITIVE_ARRAY", "PICKLED_BYTE_ARRAY"):
            return False
        return all(child.is_immutable() for child in self._children)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TypeInformation)
            and other._name == self._name
            and other._spark == self._spark
        )

    def __hash__(self) -> int:
        return hash((self._name, self._spark.simpleString()))

    def __repr__(self) -> str:
        if self._children and self._name not in ("ROW_NAMED",):
            inner = ", ".join(map(repr, self._children))
            return f"Types.{self._name}({inner})"
        return f"Types.{self._name}()"


def _fail(expected: str, value: object) -> StateTypeError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return StateTypeError(f"expected {expected}, got {python_type_name(value)} {shown}")


def _integral(name: str, bounds: tuple[int, int]) -> Callable[[Any], int]:
    low, high = bounds

    def coerce(value: Any) -> int:  # noqa: ANN401
        if type(value) is int:
            if low <= value <= high:
                return value
            raise StateTypeError(f"{value} is out of range for {name} [{low}, {high}]")
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return coerce(int(value))
        raise _fail(f"{name} (int)", value)

    return coerce


def _floating(name: str) -> Callable[[Any], float]:
    def coerce(value: Any) -> float:  # noqa: ANN401
        if type(value) is float:
            return value
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        raise _fail(f"{name} (float)", value)

    return coerce


def _coerce_str(value: Any) -> str:  # noqa: ANN401
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str(value)
    raise _fail("STRING (str)", value)


def _coerce_bool(value: Any) -> bool:  # noqa: ANN401
    if value is True or value is False:
        return value
    if type(value).__name__ == "bool_":  # numpy.bool_
        return bool(value)
    raise _fail("BOOLEAN (bool)", value)


def _coerce_bytes(value: Any) -> bytes:  # noqa: ANN401
    if type(value) is bytes:
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise _fail("bytes", value)


def _coerce_decimal(value: Any) -> decimal.Decimal:  # noqa: ANN401
    if isinstance(value, decimal.Decimal):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return decimal.Decimal(value)
    raise _fail("BIG_DEC (decimal.Decimal)", value)


def _coerce_date(value: Any) -> dt.date:  # noqa: ANN401
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    raise _fail("SQL_DATE (datetime.date)", value)


def _coerce_timestamp(value: Any) -> dt.datetime:  # noqa: ANN401
    if isinstance(value, dt.datetime):
        if hasattr(value, "to_pydatetime"):  # pandas.Timestamp
            return value.to_pydatetime()
        return value
    raise _fail("SQL_TIMESTAMP (datetime.datetime)", value)


def _coerce_any(value: Any) -> Any:  # noqa: ANN401
    return value


def _nullable(coerce: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def inner(value: Any) -> Any:  # noqa: ANN401
        return None if value is None else coerce(value)

    return inner


def _exact_type(name: str) -> Callable[[str, int], str]:
    return lambda var, depth: f"type({var}) is {name}"


def _exact_int(bounds: tuple[int, int]) -> Callable[[str, int], str]:
    low, high = bounds
    return lambda var, depth: f"(type({var}) is int and {low} <= {var} <= {high})"


_NAMESPACE: dict[str, Any] = {
    "int": int,
    "float": float,
    "str": str,
    "bytes": bytes,
    "tuple": tuple,
    "list": list,
    "dict": dict,
    "datetime": dt.datetime,
    "date": dt.date,
    "Decimal": decimal.Decimal,
    "len": len,
    "all": all,
    "type": type,
}
# The generated tests take these names as default arguments: local, not global, lookups.
_LOCALS = ", ".join(f"{name}={name}" for name in _NAMESPACE)


def compile_exact_all(info: TypeInformation) -> Callable[[Any], bool] | None:
    """A fast test that every element of a sequence needs no conversion for ``info`` (None
    elements fail; None: always convert)."""
    source = info.exact_check_source("v")
    if source is None:
        return None
    namespace = dict(_NAMESPACE)
    exec(  # noqa: S102 - generated test
        f"def exact_all(values, {_LOCALS}):\n"
        "    for v in values:\n"
        f"        if v is None or not ({source}):\n"
        "            return False\n"
        "    return True\n",
        namespace,
    )
    return namespace["exact_all"]


class Types:
    """Factories of :class:`TypeInformation`, named as PyFlink's ``Types``."""

    @staticmethod
    def STRING() -> TypeInformation:  # noqa: N802 - PyFlink's names
        return TypeInformation("STRING", T.StringType(), _coerce_str, (), _exact_type("str"))

    @staticmethod
    def BOOLEAN() -> TypeInformation:  # noqa: N802
        return TypeInformation(
            "BOOLEAN",
            T.BooleanType(),
            _coerce_bool,
            (),
            lambda v, d: f"({v} is True or {v} is False)",
        )

    @staticmethod
    def BYTE() -> TypeInformation:  # noqa: N802
        return TypeInformation(
            "BYTE", T.ByteType(), _integral("BYTE", _BYTE), (), _exact_int(_BYTE)
        )

    @staticmethod
    def SHORT() -> TypeInformation:  # noqa: N802
        return TypeInformation(
            "SHORT", T.ShortType(), _integral("SHORT", _SHORT), (), _exact_int(_SHORT)
        )

    @staticmethod
    def INT() -> TypeInformation:  # noqa: N802
        return TypeInformation("INT", T.IntegerType(), _integral("INT", _INT), (), _exact_int(_INT))

    @staticmethod
    def LONG() -> TypeInformation:  # noqa: N802
        return TypeInformation(
            "LONG", T.LongType(), _integral("LONG", _LONG), (), _exact_int(_LONG)
        )

    @staticmethod
    def FLOAT() -> TypeInformation:  # noqa: N802
        return TypeInformation("FLOAT", T.FloatType(), _floating("FLOAT"), (), _exact_type("float"))

    @staticmethod
    def DOUBLE() -> TypeInformation:  # noqa: N802
        return TypeInformation(
            "DOUBLE", T.DoubleType(), _floating("DOUBLE"), (), _exact_type("float")
        )

    @staticmethod
    def BIG_DEC(precision: int = 38, scale: int = 18) -> TypeInformation:  # noqa: N802
        return TypeInformation(
            "BIG_DEC",
            T.DecimalType(precision, scale),
            _coerce_decimal,
            (),
            _exact_type("Decimal"),
        )

    @staticmethod
    def SQL_DATE() -> TypeInformation:  # noqa: N802
        return TypeInformation("SQL_DATE", T.DateType(), _coerce_date, (), _exact_type("date"))

    @staticmethod
    def SQL_TIMESTAMP() -> TypeInformation:  # noqa: N802
        return TypeInformation(
            "SQL_TIMESTAMP", T.TimestampType(), _coerce_timestamp, (), _exact_type("datetime")
        )

    @staticmethod
    def BYTES() -> TypeInformation:  # noqa: N802
        """``bytes`` (PyFlink spells it ``Types.PRIMITIVE_ARRAY(Types.BYTE())``)."""
        return TypeInformation("BYTES", T.BinaryType(), _coerce_bytes, (), _exact_type("bytes"))

    @staticmethod
    def PICKLED_BYTE_ARRAY() -> TypeInformation:  # noqa: N802
        """Any picklable Python object, unchecked (stored pickled; Spark type ``binary``)."""
        return TypeInformation(
            "PICKLED_BYTE_ARRAY", T.BinaryType(), _coerce_any, (), lambda v, d: "True"
        )

    @staticmethod
    def LIST(element_type: Any) -> TypeInformation:  # noqa: N802, ANN401
        element = to_type_info(element_type)
        coerce_element = _nullable(element._coerce)

        def coerce(value: Any) -> list:  # noqa: ANN401
            if isinstance(value, list | tuple):
                return [coerce_element(v) for v in value]
            raise _fail(f"LIST({element!r}) (list)", value)

        def exact(var: str, depth: int) -> str | None:
            x = f"x{depth}"
            inner = element.exact_check_source(x, depth + 1)
            if inner is None:
                return None
            return f"(type({var}) is list and all({x} is None or {inner} for {x} in {var}))"

        return TypeInformation(
            "LIST", T.ArrayType(element.spark_type(), containsNull=True), coerce, (element,), exact
        )

    @staticmethod
    def PRIMITIVE_ARRAY(element_type: Any) -> TypeInformation:  # noqa: N802, ANN401
        element = to_type_info(element_type)
        if element._name == "BYTE":
            return Types.BYTES()
        return Types.LIST(element)

    BASIC_ARRAY = PRIMITIVE_ARRAY
    OBJECT_ARRAY = LIST

    @staticmethod
    def MAP(key_type: Any, value_type: Any) -> TypeInformation:  # noqa: N802, ANN401
        key = to_type_info(key_type)
        value_info = to_type_info(value_type)
        coerce_key = key._coerce
        coerce_value = _nullable(value_info._coerce)

        def coerce(value: Any) -> dict:  # noqa: ANN401
            if isinstance(value, Mapping):
                return {coerce_key(k): coerce_value(v) for k, v in value.items()}
            raise _fail(f"MAP({key!r}, {value_info!r}) (dict)", value)

        def exact(var: str, depth: int) -> str | None:
            a, b = f"a{depth}", f"b{depth}"
            key_test = key.exact_check_source(a, depth + 1)
            value_test = value_info.exact_check_source(b, depth + 1)
            if key_test is None or value_test is None:
                return None
            return (
                f"(type({var}) is dict and all({key_test} and ({b} is None or {value_test}) "
                f"for {a}, {b} in {var}.items()))"
            )

        spark = T.MapType(key.spark_type(), value_info.spark_type(), valueContainsNull=True)
        return TypeInformation("MAP", spark, coerce, (key, value_info), exact)

    @staticmethod
    def TUPLE(field_types: Sequence[Any]) -> TypeInformation:  # noqa: N802
        fields = [to_type_info(t) for t in field_types]
        coercers = [_nullable(f._coerce) for f in fields]
        n = len(fields)

        def coerce(value: Any) -> tuple:  # noqa: ANN401
            if isinstance(value, tuple | list) and len(value) == n:
                return tuple(c(v) for c, v in zip(coercers, value, strict=True))
            raise _fail(f"a tuple of {n} values", value)

        def exact(var: str, depth: int) -> str | None:
            tests = [f"type({var}) is tuple", f"len({var}) == {n}"]
            for i, f in enumerate(fields):
                # Each field read once, into a name unique to its depth and position.
                field = f"_t{depth}_{i}"
                test = f.exact_check_source(field, depth + 1)
                if test is None:
                    return None
                tests.append(f"(({field} := {var}[{i}]) is None or {test})")
            return "(" + " and ".join(tests) + ")"

        spark = T.StructType([T.StructField(f"f{i}", f.spark_type()) for i, f in enumerate(fields)])
        return TypeInformation("TUPLE", spark, coerce, tuple(fields), exact)

    @staticmethod
    def ROW(field_types: Sequence[Any]) -> TypeInformation:  # noqa: N802
        return Types.ROW_NAMED([f"f{i}" for i in range(len(field_types))], field_types)

    @staticmethod
    def ROW_NAMED(field_names: Sequence[str], field_types: Sequence[Any]) -> TypeInformation:  # noqa: N802
        if len(field_names) != len(field_types):
            raise StateTypeError("ROW_NAMED needs as many field names as field types")
        names = list(field_names)
        fields = [to_type_info(t) for t in field_types]
        coercers = [_nullable(f._coerce) for f in fields]
        cls = row_class(tuple(names))

        def coerce(value: Any) -> Row:  # noqa: ANN401
            if isinstance(value, Mapping):
                missing = [n for n in names if n not in value]
                if missing:
                    raise _fail(f"a row with fields {names} (missing {missing})", value)
                values = [value[n] for n in names]
            elif isinstance(value, tuple | list) and len(value) == len(names):
                values = list(value)
            else:
                raise _fail(f"a row with fields {names}", value)
            return tuple.__new__(cls, [c(v) for c, v in zip(coercers, values, strict=True)])

        spark = T.StructType(
            [T.StructField(n, f.spark_type()) for n, f in zip(names, fields, strict=True)]
        )
        return TypeInformation("ROW_NAMED", spark, coerce, tuple(fields))


_PY_SCALARS: dict[type, Callable[[], TypeInformation]] = {
    int: Types.LONG,
    float: Types.DOUBLE,
    str: Types.STRING,
    bool: Types.BOOLEAN,
    bytes: Types.BYTES,
    decimal.Decimal: Types.BIG_DEC,
    dt.datetime: Types.SQL_TIMESTAMP,
    dt.date: Types.SQL_DATE,
}

_SPARK_SIMPLE: dict[type, Callable[[], TypeInformation]] = {
    T.StringType: Types.STRING,
    T.BooleanType: Types.BOOLEAN,
    T.ByteType: Types.BYTE,
    T.ShortType: Types.SHORT,
    T.IntegerType: Types.INT,
    T.LongType: Types.LONG,
    T.FloatType: Types.FLOAT,
    T.DoubleType: Types.DOUBLE,
    T.DateType: Types.SQL_DATE,
    T.TimestampType: Types.SQL_TIMESTAMP,
    T.TimestampNTZType: Types.SQL_TIMESTAMP,
    T.BinaryType: Types.BYTES,
}

_NAMES: dict[str, Callable[[], TypeInformation]] = {
    "string": Types.STRING,
    "str": Types.STRING,
    "boolean": Types.BOOLEAN,
    "bool": Types.BOOLEAN,
    "tinyint": Types.BYTE,
    "byte": Types.BYTE,
    "smallint": Types.SHORT,
    "short": Types.SHORT,
    "int": Types.INT,
    "integer": Types.INT,
    "bigint": Types.LONG,
    "long": Types.LONG,
    "float": Types.FLOAT,
    "double": Types.DOUBLE,
    "date": Types.SQL_DATE,
    "timestamp": Types.SQL_TIMESTAMP,
    "binary": Types.BYTES,
}


def _from_spark(data_type: T.DataType) -> TypeInformation:
    for cls, factory in _SPARK_SIMPLE.items():
        if type(data_type) is cls:
            return factory()
    if isinstance(data_type, T.DecimalType):
        return Types.BIG_DEC(data_type.precision, data_type.scale)
    if isinstance(data_type, T.ArrayType):
        return Types.LIST(_from_spark(data_type.elementType))
    if isinstance(data_type, T.MapType):
        return Types.MAP(_from_spark(data_type.keyType), _from_spark(data_type.valueType))
    if isinstance(data_type, T.StructType):
        return Types.ROW_NAMED(data_type.names, [_from_spark(f.dataType) for f in data_type.fields])
    raise StateTypeError(f"Spark type {data_type.simpleString()} is not supported for state")


def to_type_info(declared: Any) -> TypeInformation:  # noqa: ANN401 - a type declaration
    """The :class:`TypeInformation` of a declaration: ``Types.*()``, a Python type, a typing
    generic (``list[int]``, ``dict[str, float]``, ``tuple[int, str]``, ``Optional[int]``), a Spark
    ``DataType`` or a Spark type name (``"bigint"``)."""
    if isinstance(declared, TypeInformation):
        return declared
    if isinstance(declared, T.DataType):
        return _from_spark(declared)
    if isinstance(declared, str):
        factory = _NAMES.get(declared.strip().lower())
        if factory is None:
            raise StateTypeError(
                f"unknown type name {declared!r}; use Types.*(), a Python type or a Spark DataType"
            )
        return factory()
    if declared is Any or declared is object:
        return Types.PICKLED_BYTE_ARRAY()
    if isinstance(declared, type) and declared in _PY_SCALARS:
        return _PY_SCALARS[declared]()
    origin = typing.get_origin(declared)
    args = typing.get_args(declared)
    if origin is typing.Union or origin is pytypes.UnionType:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return to_type_info(rest[0])
        return Types.PICKLED_BYTE_ARRAY()
    if origin in (list, Sequence) or declared is list:
        return Types.LIST(args[0] if args else Any)
    if origin in (dict, Mapping) or declared is dict:
        if not args:
            return Types.MAP(str, Any)
        return Types.MAP(args[0], args[1])
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return Types.LIST(args[0])
        return Types.TUPLE(list(args))
    raise StateTypeError(
        f"cannot map {declared!r} to a Spark type; use Types.*(), int, float, str, bool, bytes, "
        "decimal.Decimal, datetime.date, datetime.datetime, list[...], dict[...], tuple[...], "
        "a Spark DataType, or Types.PICKLED_BYTE_ARRAY() for any picklable object"
    )


class _Check:
    """Checks values against a declared type: ``one`` is a generated function that returns a
    value already in its stored form as it is (one call, the test inline) and otherwise the
    type's conversion, which normalises or raises :class:`StateTypeError` naming the state."""

    __slots__ = ("one", "exact_all", "_coerce", "_message")

    def __init__(self, descriptor: Any, info: TypeInformation, what: str) -> None:  # noqa: ANN401
        self._coerce = info._coerce
        self._message = f"{type(descriptor).__name__[:-10]} '{descriptor.name}' {what}"
        self.exact_all = compile_exact_all(info)
        source = info.exact_check_source("v")
        if source is None:
            self.one: Callable[[Any], Any] = self.convert
        else:
            namespace = dict(_NAMESPACE, convert=self.convert)
            exec(  # noqa: S102 - generated test
                f"def one(v, {_LOCALS}):\n    return v if {source} else convert(v)\n", namespace
            )
            self.one = namespace["one"]

    def convert(self, value: Any) -> Any:  # noqa: ANN401
        try:
            return self._coerce(value)
        except StateTypeError as error:
            raise StateTypeError(f"{self._message}: {error}") from None


def checker(descriptor: Any, info: TypeInformation, what: str) -> _Check | None:  # noqa: ANN401
    """A checker for values of ``info``, or None when the type is unchecked (pickled)."""
    return None if info.is_pickled() else _Check(descriptor, info, what)
