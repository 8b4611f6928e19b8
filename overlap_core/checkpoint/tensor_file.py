"""Named arrays in the safetensors file format, with NumPy only.

Checkpoints store their tensors in this format because it is the one both
frameworks, and users without tfoverlap, can read without pickle:
`safetensors.numpy.load_file`, `safetensors.torch.load_file`, or the twenty
lines of `read_tensor_file` below. The layout is:

  8 bytes   little-endian u64 N, the header length
  N bytes   JSON: {name: {"dtype", "shape", "data_offsets": [begin, end]},
                   "__metadata__": {str: str}}, padded with spaces to 8 bytes
  rest      the arrays' bytes, C order, little-endian, back to back

`write_tensor_file` checksums the bytes as it writes them, so a
checkpoint's manifest gets its checksum without reading the file a second
time.
"""

import json
import os
import struct
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from overlap_core.checkpoint import checksum

_HEADER_ALIGNMENT = 8
_METADATA_KEY = "__metadata__"
# safetensors dtype names <-> NumPy dtype names (bfloat16 comes from
# ml_dtypes, which both TensorFlow and JAX install, when it is there).
_DTYPE_NAMES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8",
    "bool": "BOOL",
}
_NUMPY_NAMES = {v: k for k, v in _DTYPE_NAMES.items()}


class TensorFileError(ValueError):
  """A tensor file that is not valid safetensors, or an unsupported array."""


def _numpy_dtype(name: str) -> np.dtype:
  if name == "bfloat16":
    try:
      import ml_dtypes  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise TensorFileError("bfloat16 tensors need the ml_dtypes package "
                            "to be read as arrays") from e
    return np.dtype(ml_dtypes.bfloat16)
  return np.dtype(name)


def write_tensor_file(path: str, arrays: Mapping[str, np.ndarray], *,
                      metadata: Optional[Mapping[str, str]] = None,
                      fsync: bool = True) -> Tuple[str, int]:
  """Writes `arrays` to `path` in the safetensors format.

  Args:
    path: the file to create (overwritten if it exists).
    arrays: name -> array; written in this order.
    metadata: string pairs stored in the header.
    fsync: flush the file to stable storage before returning.

  Returns:
    (the whole file's `checksum.WRITTEN` hex checksum, its size in bytes).

  Raises:
    TensorFileError: an array of a dtype the format has no name for.
    OSError: the write failed (a full disk, a size limit, permissions).
  """
  header = {}
  offset = 0
  contiguous = {}
  for name, array in arrays.items():
    array = np.require(array, requirements="C")  # keeps 0-d arrays 0-d
    dtype_name = _DTYPE_NAMES.get(array.dtype.name)
    if dtype_name is None:
      raise TensorFileError(f"tensor {name!r}: dtype {array.dtype} has no "
                            "safetensors name")
    if array.dtype.byteorder == ">":
      array = array.astype(array.dtype.newbyteorder("<"))
    header[name] = {"dtype": dtype_name, "shape": list(array.shape),
                    "data_offsets": [offset, offset + array.nbytes]}
    offset += array.nbytes
    contiguous[name] = array
  if metadata:
    header[_METADATA_KEY] = {str(k): str(v) for k, v in metadata.items()}
  header_bytes = json.dumps(header, separators=(",", ":")).encode()
  header_bytes += b" " * (-len(header_bytes) % _HEADER_ALIGNMENT)

  digest = checksum.new()
  with open(path, "wb") as f:

    def emit(chunk) -> None:
      digest.update(chunk)
      f.write(chunk)

    emit(struct.pack("<Q", len(header_bytes)))
    emit(header_bytes)
    for array in contiguous.values():
      # A byte view writes the array's buffer without another copy.
      emit(memoryview(array.reshape(-1).view(np.uint8)))
    f.flush()
    if fsync:
      os.fsync(f.fileno())
    size = f.tell()
  return digest.hexdigest(), size


def read_tensor_file(path: str) -> Tuple[Dict[str, np.ndarray],
                                         Dict[str, str]]:
  """Reads a safetensors file; returns (name -> array, metadata).

  Raises:
    TensorFileError: the file is truncated or its header is malformed.
    OSError: the file cannot be read.
  """
  with open(path, "rb") as f:
    return parse_tensor_bytes(f.read(), source=path)


def parse_tensor_bytes(blob: bytes, *, source: str = "<bytes>"
                       ) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
  """Parses the bytes of a safetensors file; the arrays are views of them.

  Whoever checksummed `blob` then uses exactly the bytes it checked. Every
  field of the header is checked before it is used, so a damaged file is
  one TensorFileError naming `source`, never a KeyError or a reshape error.

  Returns:
    (name -> read-only array, metadata).

  Raises:
    TensorFileError: truncated, or a header that is not what was written.
  """
  if len(blob) < 8:
    raise TensorFileError(f"{source}: truncated ({len(blob)} bytes)")
  (header_len,) = struct.unpack("<Q", blob[:8])
  if 8 + header_len > len(blob):
    raise TensorFileError(f"{source}: header of {header_len} bytes runs past "
                          f"the end of the file ({len(blob)} bytes)")
  try:
    header = json.loads(bytes(blob[8:8 + header_len]))
  except ValueError as e:  # UnicodeDecodeError is a ValueError too
    raise TensorFileError(f"{source}: unreadable header: {e}") from e
  if not isinstance(header, dict):
    raise TensorFileError(f"{source}: the header is not a JSON object")
  metadata = header.pop(_METADATA_KEY, {})
  if not (isinstance(metadata, dict) and all(
      isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
    raise TensorFileError(f"{source}: metadata is not string pairs")
  data = memoryview(blob)[8 + header_len:]
  arrays = {}
  for name, entry in header.items():
    dtype, shape, begin, end = _checked_entry(source, name, entry, len(data))
    arrays[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape)
  return arrays, metadata


def _checked_entry(source: str, name: str, entry, data_len: int):
  """(dtype, shape, begin, end) of one header entry, or TensorFileError."""
  def bad(what: str) -> TensorFileError:
    return TensorFileError(f"{source}: tensor {name!r}: {what}")

  if not isinstance(entry, dict):
    raise bad("header entry is not an object")
  dtype_name = entry.get("dtype")
  if dtype_name not in _NUMPY_NAMES:
    raise bad(f"unknown dtype {dtype_name!r}")
  shape, offsets = entry.get("shape"), entry.get("data_offsets")
  if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
    raise bad(f"shape {shape!r} is not a list of sizes")
  if not (isinstance(offsets, list) and len(offsets) == 2
          and all(_is_count(o) for o in offsets)):
    raise bad(f"data_offsets {offsets!r} is not [begin, end]")
  begin, end = offsets
  if end > data_len or begin > end:
    raise bad("lies past the end of the file")
  dtype = _numpy_dtype(_NUMPY_NAMES[dtype_name])
  if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != end - begin:
    raise bad(f"{end - begin} bytes do not hold shape {tuple(shape)} of "
              f"{dtype_name}")
  return dtype, tuple(shape), begin, end


def _is_count(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0
