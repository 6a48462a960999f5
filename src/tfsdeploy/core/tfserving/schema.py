"""A compact way to write protobuf message definitions, and their descriptors built from it.

The toolkit declares the TFServing and TensorFlow messages it uses in ``definitions.py`` with
the small vocabulary below (a message, its fields with their numbers, types and labels, its
enums, oneofs, maps and reserved numbers) instead of shipping generated ``_pb2`` modules: those
come only with the ``tensorflow`` wheel (``tensorflow-serving-api`` requires it), about 2 GB on
a deploy machine. ``file_descriptor`` turns one declared file into the
``FileDescriptorProto`` that protoc would have made of it (the parts that decide the wire and
the text format), and ``build_pool`` loads them all into a private ``DescriptorPool``.

Why a private pool: a process that also imports TensorFlow's own ``_pb2`` modules (the tests
do, to compare) registers the same message names in protobuf's default pool, and one pool
cannot hold one name twice.

Type names are written as in a .proto file of the declaring file's package: a scalar keyword
(``int64``, ``string`` ...), a name relative to the package (``TensorShapeProto.Dim``), or an
absolute name with a leading dot (``.google.protobuf.Int64Value``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, wrappers_pb2

_F = descriptor_pb2.FieldDescriptorProto
SCALARS: dict[str, int] = {
    "double": _F.TYPE_DOUBLE, "float": _F.TYPE_FLOAT, "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64, "int32": _F.TYPE_INT32, "fixed64": _F.TYPE_FIXED64,
    "fixed32": _F.TYPE_FIXED32, "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES, "uint32": _F.TYPE_UINT32, "sfixed32": _F.TYPE_SFIXED32,
    "sfixed64": _F.TYPE_SFIXED64, "sint32": _F.TYPE_SINT32, "sint64": _F.TYPE_SINT64,
}
# protobuf's own files, taken from the protobuf package (they are not TensorFlow's)
WELL_KNOWN = (wrappers_pb2.DESCRIPTOR, any_pb2.DESCRIPTOR)


class SchemaError(ValueError):
    """A definition that protoc would refuse (an unknown type, a number used twice ...)."""


@dataclass(frozen=True)
class Field:
    """One field: ``repeated`` (``packed`` when the .proto says so explicitly), proto3
    ``optional`` (``presence``), in a oneof, or a map (``map_key`` set, ``type`` is then the
    value's type)."""

    name: str
    number: int
    type: str
    repeated: bool = False
    presence: bool = False
    oneof: str = ""
    map_key: str = ""
    packed: bool = False


@dataclass(frozen=True)
class Enum:
    """An enum and its values, in declaration order."""

    name: str
    values: tuple[tuple[str, int], ...]
    allow_alias: bool = False


@dataclass(frozen=True)
class Oneof:
    """A oneof and its fields (flattened into the message by ``msg``)."""

    name: str
    fields: tuple[Field, ...]


@dataclass(frozen=True)
class Reserved:
    """Reserved field numbers (``[start, end)`` ranges) and names."""

    ranges: tuple[tuple[int, int], ...]
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Message:
    """A message: fields, nested messages and enums, reserved numbers and names."""

    name: str
    fields: tuple[Field, ...] = ()
    nested: tuple[Message, ...] = ()
    enums: tuple[Enum, ...] = ()
    reserved: Reserved = Reserved(())


@dataclass(frozen=True)
class File:
    """A .proto file: its name, package, top-level messages and enums (proto3)."""

    name: str
    package: str
    messages: tuple[Message, ...] = ()
    enums: tuple[Enum, ...] = ()


# -- the vocabulary definitions.py is written in ---------------------------------------------


def f(name: str, number: int, type_: str) -> Field:
    """A singular field (proto3: no presence for scalars)."""
    return Field(name, number, type_)


def opt(name: str, number: int, type_: str) -> Field:
    """A proto3 ``optional`` field (explicit presence)."""
    return Field(name, number, type_, presence=True)


def rep(name: str, number: int, type_: str) -> Field:
    """A ``repeated`` field."""
    return Field(name, number, type_, repeated=True)


def packed(name: str, number: int, type_: str) -> Field:
    """A ``repeated`` scalar field declared ``[packed = true]`` (proto3 packs them anyway:
    the option changes no byte, but it is part of the declaration)."""
    return Field(name, number, type_, repeated=True, packed=True)


def mapf(name: str, number: int, key: str, value: str) -> Field:
    """A ``map<key, value>`` field."""
    return Field(name, number, value, repeated=True, map_key=key)


def oneof(name: str, *fields: Field) -> Oneof:
    """A oneof of singular fields."""
    return Oneof(name, tuple(Field(x.name, x.number, x.type, oneof=name) for x in fields))


def enum(name: str, values: str, *, alias: bool = False) -> Enum:
    """An enum from ``"NAME=0 OTHER=1 ..."``."""
    pairs = []
    for item in values.split():
        value_name, _, number = item.partition("=")
        pairs.append((value_name, int(number)))
    return Enum(name, tuple(pairs), alias)


def reserved(*ranges: tuple[int, int], names: Sequence[str] = ()) -> Reserved:
    """Reserved ``[start, end)`` number ranges and names."""
    return Reserved(tuple(ranges), tuple(names))


def msg(name: str, *items: Field | Oneof | Message | Enum | Reserved) -> Message:
    """A message from its fields, oneofs, nested messages and enums, and reserved numbers."""
    fields: list[Field] = []
    nested: list[Message] = []
    enums: list[Enum] = []
    kept = Reserved(())
    for item in items:
        if isinstance(item, Field):
            fields.append(item)
        elif isinstance(item, Oneof):
            fields.extend(item.fields)
        elif isinstance(item, Message):
            nested.append(item)
        elif isinstance(item, Enum):
            enums.append(item)
        else:
            kept = item
    return Message(name, tuple(fields), tuple(nested), tuple(enums), kept)


def proto_file(name: str, package: str, *items: Message | Enum) -> File:
    """A file from its top-level messages and enums."""
    return File(name, package, tuple(i for i in items if isinstance(i, Message)),
                tuple(i for i in items if isinstance(i, Enum)))


# -- descriptors -------------------------------------------------------------------------------


def _walk(prefix: str, messages: Iterable[Message]) -> Iterator[tuple[str, Message]]:
    for message in messages:
        full = f"{prefix}.{message.name}"
        yield full, message
        yield from _walk(full, message.nested)


def type_index(files: Sequence[File]) -> dict[str, tuple[str, bool]]:
    """Every declared type's full name (leading dot) -> (its file, whether it is an enum);
    protobuf's well-known files included."""
    index: dict[str, tuple[str, bool]] = {}
    for known in WELL_KNOWN:
        for message_name in known.message_types_by_name:
            index[f".{known.package}.{message_name}"] = (known.name, False)
    for file in files:
        top = f".{file.package}"
        for full, message in _walk(top, file.messages):
            index[full] = (file.name, False)
            for item in message.enums:
                index[f"{full}.{item.name}"] = (file.name, True)
        for item in file.enums:
            index[f"{top}.{item.name}"] = (file.name, True)
    return index


def _absolute(type_: str, package: str) -> str:
    return type_ if type_.startswith(".") else f".{package}.{type_}"


def _map_entry_name(field_name: str) -> str:
    """protoc's name of a map field's entry message: ``version_labels`` ->
    ``VersionLabelsEntry``."""
    return "".join(part[:1].upper() + part[1:] for part in field_name.split("_")) + "Entry"


class _Builder:
    """One file's descriptor: types resolved against the index, dependencies collected."""

    def __init__(self, file: File, index: dict[str, tuple[str, bool]]) -> None:
        self.file = file
        self.index = index
        self.dependencies: dict[str, None] = {}

    def set_type(self, proto: descriptor_pb2.FieldDescriptorProto, type_: str,
                 where: str) -> None:
        if type_ in SCALARS:
            proto.type = SCALARS[type_]
            return
        full = _absolute(type_, self.file.package)
        if full not in self.index:
            raise SchemaError(f"{self.file.name}: {where}: unknown type {type_!r}")
        owner, is_enum = self.index[full]
        proto.type = _F.TYPE_ENUM if is_enum else _F.TYPE_MESSAGE
        proto.type_name = full
        if owner != self.file.name:
            self.dependencies[owner] = None

    def message(self, message: Message, full: str) -> descriptor_pb2.DescriptorProto:
        proto = descriptor_pb2.DescriptorProto(name=message.name)
        self._check_numbers(message, full)
        oneofs = list(dict.fromkeys(x.oneof for x in message.fields if x.oneof))
        synthetic = [x for x in message.fields if x.presence]
        for item in oneofs + [f"_{x.name}" for x in synthetic]:
            proto.oneof_decl.add(name=item)
        for field in message.fields:
            self._field(proto, field, full, oneofs, synthetic)
        for nested in message.nested:
            proto.nested_type.append(self.message(nested, f"{full}.{nested.name}"))
        proto.enum_type.extend(enum_proto(e) for e in message.enums)
        for start, end in message.reserved.ranges:
            proto.reserved_range.add(start=start, end=end)
        proto.reserved_name.extend(message.reserved.names)
        return proto

    def _field(self, proto: descriptor_pb2.DescriptorProto, field: Field, full: str,
               oneofs: list[str], synthetic: list[Field]) -> None:
        item = proto.field.add(name=field.name, number=field.number)
        item.label = _F.LABEL_REPEATED if field.repeated else _F.LABEL_OPTIONAL
        where = f"{full[1:]}.{field.name}"
        if field.map_key:
            entry = proto.nested_type.add(name=_map_entry_name(field.name))
            entry.options.map_entry = True
            key = entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL)
            self.set_type(key, field.map_key, where)
            value = entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL)
            self.set_type(value, field.type, where)
            item.type = _F.TYPE_MESSAGE
            item.type_name = f"{full}.{entry.name}"
            return
        self.set_type(item, field.type, where)
        if field.packed:
            item.options.packed = True
        if field.oneof:
            item.oneof_index = oneofs.index(field.oneof)
        elif field.presence:
            item.oneof_index = len(oneofs) + synthetic.index(field)
            item.proto3_optional = True

    def _check_numbers(self, message: Message, full: str) -> None:
        seen: dict[int, str] = {}
        for field in message.fields:
            if field.number in seen or field.name in seen.values():
                raise SchemaError(f"{self.file.name}: {full[1:]}: field {field.name} = "
                                  f"{field.number} repeats a name or number")
            if any(start <= field.number < end for start, end in message.reserved.ranges):
                raise SchemaError(f"{self.file.name}: {full[1:]}.{field.name}: number "
                                  f"{field.number} is reserved")
            seen[field.number] = field.name


def enum_proto(item: Enum) -> descriptor_pb2.EnumDescriptorProto:
    """An enum's descriptor."""
    proto = descriptor_pb2.EnumDescriptorProto(name=item.name)
    for value_name, number in item.values:
        proto.value.add(name=value_name, number=number)
    if item.allow_alias:
        proto.options.allow_alias = True
    return proto


def file_descriptor(file: File, index: dict[str, tuple[str, bool]]
                    ) -> descriptor_pb2.FileDescriptorProto:
    """The ``FileDescriptorProto`` of one declared file (its imports derived from the types
    its fields name)."""
    builder = _Builder(file, index)
    proto = descriptor_pb2.FileDescriptorProto(name=file.name, package=file.package,
                                               syntax="proto3")
    for message in file.messages:
        proto.message_type.append(builder.message(message, f".{file.package}.{message.name}"))
    proto.enum_type.extend(enum_proto(e) for e in file.enums)
    proto.dependency.extend(builder.dependencies)
    return proto


def build_pool(files: Sequence[File]) -> descriptor_pool.DescriptorPool:
    """A private pool holding protobuf's well-known files and every declared file."""
    index = type_index(files)
    protos = {file.name: file_descriptor(file, index) for file in files}
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str, path: tuple[str, ...]) -> None:
        if name in added:
            return
        if name in path:
            raise SchemaError(f"files import each other: {' -> '.join((*path, name))}")
        for dependency in protos[name].dependency:
            if dependency in protos:
                add(dependency, (*path, name))
        pool.Add(protos[name])
        added.add(name)

    for known in WELL_KNOWN:
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(known.serialized_pb))
    for name in protos:
        add(name, ())
    return pool
