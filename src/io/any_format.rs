//! Tables of every [`Format`] in safetensors files: [`save_tables`],
//! [`load_table`], [`load_packed`] and their in-memory forms. The layout
//! (format → dtype → shape → metadata) is in the
//! [module docs](super#tables-of-every-format).
//!
//! ```text
//! save:  check every name
//!        each table -> one tensor, lent to the safetensors serializer as it
//!                      lies in memory (F32 / F16 / BF16 values, U8 packed rows)
//!        serialize without metadata, then put the metadata of the packed
//!        tables into the header, sorted by key
//! load:  read and check the header (super::header), keeping the tensor's
//!        shape and its two metadata entries only
//!        find the tensor -> its dtype -> 2-D -> its format and width
//!        (dtype, or metadata, or the caller) -> row length checked
//!        -> only then read (from a path) or borrow (from bytes) its bytes
//!        and copy the values out
//! ```
//!
//! 1. **Why the metadata is put in by hand.** The serializer takes the
//!    metadata as a `HashMap` and writes it in that map's iteration order,
//!    which differs from one map to the next even within one process: two
//!    saves of the same tables would give different bytes. The header it
//!    writes without metadata is a JSON object padded with spaces to a
//!    multiple of 8 bytes; [`insert_metadata`] writes the `__metadata__`
//!    entry, sorted, as its first member (where the serializer puts it) and
//!    pads again. The data offsets count from the end of the header, so
//!    they do not move.
//! 2. **One parse.** The header is parsed once: the tensor's dtype, shape
//!    and byte range and the two metadata entries come from the same pass.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::fs::File;
use std::path::Path;

use safetensors::{Dtype, SafeTensorError, View};

use super::body::Body;
use super::header::{self, Entry, Header, Keep, LEN_BYTES as HEADER_LEN_BYTES};
use super::{FileError, METADATA_KEY, check_name, find, two_d, write_atomically};
use crate::formats::{Data, Format, OwnedTable, RowWise, TableRef};

/// The dtypes [`load_table`] reads.
const TABLE_DTYPES: &str = "F32, F16, BF16 or U8";

/// The dtype [`load_packed`] reads.
const PACKED_DTYPE: &str = "U8";

/// The metadata key of a packed tensor's format.
fn format_key(name: &str) -> String {
    format!("{name}.format")
}

/// The metadata key of a packed tensor's width.
fn dim_key(name: &str) -> String {
    format!("{name}.dim")
}

/// Writes `tables` to the safetensors file at `path`, each `(name, table)`
/// as one tensor in its format's dtype and shape, with the metadata of the
/// packed ones (the table in the [module docs](super#tables-of-every-format)).
///
/// Every name is checked before anything is written; on any error no file is
/// created and an existing file at `path` is left as it was (see the
/// [module docs](super#saving-is-all-or-nothing)).
///
/// # Errors
///
/// The first problem found, checking the names in order:
/// [`FileError::ReservedName`], [`FileError::DuplicateName`]; then
/// [`FileError::Io`] if the file cannot be written.
pub fn save_tables(
    path: impl AsRef<Path>,
    tables: &[(&str, &OwnedTable)],
) -> Result<(), FileError> {
    let bytes = tables_to_bytes(tables)?;
    write_atomically(path.as_ref(), &bytes)?;
    Ok(())
}

/// The bytes of the safetensors file [`save_tables`] would write.
///
/// # Errors
///
/// As [`save_tables`], less [`FileError::Io`].
pub fn tables_to_bytes(tables: &[(&str, &OwnedTable)]) -> Result<Vec<u8>, FileError> {
    let mut names = HashSet::with_capacity(tables.len());
    for &(name, _) in tables {
        check_name(&mut names, name)?;
    }
    let mut metadata = BTreeMap::new();
    let mut views = Vec::with_capacity(tables.len());
    for &(name, table) in tables {
        if let Some(packing) = table.format().row_wise() {
            metadata.insert(format_key(name), Format::from(packing).name().to_owned());
            metadata.insert(dim_key(name), table.dim().to_string());
        }
        views.push((name, TableView::new(table.as_ref())));
    }
    let mut bytes = safetensors::serialize(views, None)?;
    if !metadata.is_empty() {
        insert_metadata(&mut bytes, &metadata)?;
    }
    Ok(bytes)
}

/// Reads the table `name`, of any format, from the safetensors file at
/// `path`: F32, F16 and BF16 tensors by their dtype, U8 tensors (packed
/// rows) by the file's metadata (see the
/// [module docs](super#tables-of-every-format)). Only the header and that
/// tensor's bytes are read ([module docs](super#hostile-files)).
///
/// The file's other tensors may have any dtype and shape.
///
/// # Errors
///
/// [`FileError::Io`] if the file cannot be read; the header's errors, as
/// for [`load`](super::load); [`FileError::MissingTensor`] (with the
/// names the file holds) if it has no tensor `name`;
/// [`FileError::UnsupportedDtype`] unless that tensor is F32, F16, BF16 or
/// U8; [`FileError::TooManyDims`] or [`FileError::WrongShape`] unless it is
/// 2-D. Then for a U8 tensor, in this order: [`FileError::MissingFormat`],
/// [`FileError::UnknownFormat`] (not `int8`, `int4` or `int2`),
/// [`FileError::MissingDim`], [`FileError::BadDim`]. Last, for any tensor,
/// [`FileError::RowTooLong`] if a row's bytes overflow `usize`, for a U8
/// tensor [`FileError::PackedLayout`] unless its second dimension is the
/// length of a packed row of that format and width, and
/// [`FileError::AllocationFailed`] if the memory for its bytes is refused.
pub fn load_table(path: impl AsRef<Path>, name: &str) -> Result<OwnedTable, FileError> {
    let mut file = File::open(path)?;
    let keys = metadata_keys(name);
    let header = header::from_file(&mut file, &Keep::One { name, keys: &keys })?;
    read_table(&header, name, &mut Body::File(&mut file))
}

/// Reads the table `name`, of any format, from the bytes of a safetensors
/// file (see [`load_table`]).
///
/// # Errors
///
/// As [`load_table`], less [`FileError::Io`].
pub fn table_from_bytes(bytes: &[u8], name: &str) -> Result<OwnedTable, FileError> {
    let keys = metadata_keys(name);
    let header = header::from_bytes(bytes, &Keep::One { name, keys: &keys })?;
    read_table(&header, name, &mut Body::Bytes(bytes))
}

/// Reads the U8 tensor `name` of the safetensors file at `path` as a table
/// of packed rows of `format`, `dim` values each: a tensor that PyTorch's
/// `embedding_bag_*_prepack` made and `safetensors.torch.save_file` wrote,
/// with no metadata.
///
/// The file's metadata is not read: `format` and `dim` are the caller's
/// word. (At 4 and 2 bits the shape cannot tell them: rows of 13 and of 14
/// values both take 11 bytes at 4 bits.) For a file [`save_tables`] wrote,
/// [`load_table`] reads them from the file.
///
/// # Errors
///
/// [`FileError::Io`], the header's errors and [`FileError::MissingTensor`]
/// as for [`load_table`]; [`FileError::UnsupportedDtype`] unless the tensor
/// is U8; [`FileError::TooManyDims`] or [`FileError::WrongShape`] unless it
/// is 2-D; [`FileError::RowTooLong`] if a row of `dim` overflows `usize`;
/// [`FileError::PackedLayout`] unless its second dimension is
/// [`format.row_bytes(dim)`](RowWise::row_bytes);
/// [`FileError::AllocationFailed`] if the memory for its bytes is refused.
pub fn load_packed(
    path: impl AsRef<Path>,
    name: &str,
    format: RowWise,
    dim: usize,
) -> Result<OwnedTable, FileError> {
    let mut file = File::open(path)?;
    let header = header::from_file(&mut file, &Keep::One { name, keys: &[] })?;
    read_packed(&header, name, format, dim, &mut Body::File(&mut file))
}

/// Reads the U8 tensor `name` of the bytes of a safetensors file as a table
/// of packed rows of `format`, `dim` values each (see [`load_packed`]).
///
/// # Errors
///
/// As [`load_packed`], less [`FileError::Io`].
pub fn packed_from_bytes(
    bytes: &[u8],
    name: &str,
    format: RowWise,
    dim: usize,
) -> Result<OwnedTable, FileError> {
    let header = header::from_bytes(bytes, &Keep::One { name, keys: &[] })?;
    read_packed(&header, name, format, dim, &mut Body::Bytes(bytes))
}

/// The metadata keys [`load_table`] reads for the tensor `name`.
fn metadata_keys(name: &str) -> [String; 2] {
    [format_key(name), dim_key(name)]
}

/// Reads the table `name` of any format of a checked header from `body`.
fn read_table(header: &Header, name: &str, body: &mut Body<'_>) -> Result<OwnedTable, FileError> {
    let entry = find(header, name)?;
    let format = match entry.dtype {
        Dtype::F32 => Some(Format::F32),
        Dtype::F16 => Some(Format::F16),
        Dtype::BF16 => Some(Format::Bf16),
        Dtype::U8 => None,
        other => return Err(unsupported_dtype(name, other, TABLE_DTYPES)),
    };
    let [rows, columns] = two_d(entry)?;
    match format {
        Some(format) => {
            let dim = columns;
            let row_bytes = row_bytes(name, format, dim)?;
            owned(format, dim, rows, row_bytes, &body.bytes(header, entry)?)
        }
        None => {
            let format = packed_format(header, name)?;
            let dim = packed_dim(header, name, format)?;
            packed(name, format, dim, [rows, columns], header, entry, body)
        }
    }
}

/// Reads the U8 tensor `name` of a checked header from `body` as packed
/// rows of `format` and `dim`.
fn read_packed(
    header: &Header,
    name: &str,
    format: RowWise,
    dim: usize,
    body: &mut Body<'_>,
) -> Result<OwnedTable, FileError> {
    let entry = find(header, name)?;
    if entry.dtype != Dtype::U8 {
        return Err(unsupported_dtype(name, entry.dtype, PACKED_DTYPE));
    }
    let shape = two_d(entry)?;
    packed(name, format, dim, shape, header, entry, body)
}

/// The packed format the metadata gives the U8 tensor `name`.
fn packed_format(header: &Header, name: &str) -> Result<RowWise, FileError> {
    let value = header
        .metadata(&format_key(name))
        .ok_or_else(|| FileError::MissingFormat {
            name: name.to_owned(),
        })?;
    Format::from_name(value)
        .and_then(Format::row_wise)
        .ok_or_else(|| FileError::UnknownFormat {
            name: name.to_owned(),
            format: value.to_owned(),
        })
}

/// The width the metadata gives the U8 tensor `name`, of `format`.
fn packed_dim(header: &Header, name: &str, format: RowWise) -> Result<usize, FileError> {
    let value = header
        .metadata(&dim_key(name))
        .ok_or_else(|| FileError::MissingDim {
            name: name.to_owned(),
            format,
        })?;
    parse_dim(value).ok_or_else(|| FileError::BadDim {
        name: name.to_owned(),
        dim: value.to_owned(),
    })
}

/// A width as [`tables_to_bytes`] writes it: decimal digits, no sign, no
/// spaces, no leading zero (but `0` itself), in `usize`.
fn parse_dim(text: &str) -> Option<usize> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    let canonical = digits && (text == "0" || !text.starts_with('0'));
    // `usize::from_str` alone would take a leading `+`.
    canonical.then(|| text.parse().ok()).flatten()
}

fn unsupported_dtype(name: &str, dtype: Dtype, expected: &'static str) -> FileError {
    FileError::UnsupportedDtype {
        name: name.to_owned(),
        dtype: dtype.to_string(),
        expected,
    }
}

/// Bytes of a row of `dim` values of `format`, unless that overflows.
fn row_bytes(name: &str, format: Format, dim: usize) -> Result<usize, FileError> {
    format.row_bytes(dim).ok_or_else(|| FileError::RowTooLong {
        name: name.to_owned(),
        format,
        dim,
    })
}

/// The packed table `[rows, columns]` of `format` and `dim`, once its
/// columns are the length of a packed row.
fn packed(
    name: &str,
    format: RowWise,
    dim: usize,
    [rows, columns]: [usize; 2],
    header: &Header,
    entry: &Entry,
    body: &mut Body<'_>,
) -> Result<OwnedTable, FileError> {
    let expected_row_bytes = row_bytes(name, format.into(), dim)?;
    if expected_row_bytes != columns {
        return Err(FileError::PackedLayout {
            name: name.to_owned(),
            format,
            dim,
            expected_row_bytes,
            got: columns,
        });
    }
    let data = body.bytes(header, entry)?;
    owned(format.into(), dim, rows, expected_row_bytes, &data)
}

/// The table of `rows` rows of `row_bytes` each in `data`, copied out.
fn owned(
    format: Format,
    dim: usize,
    rows: usize,
    row_bytes: usize,
    data: &[u8],
) -> Result<OwnedTable, FileError> {
    // The parser has checked that the byte range matches dtype and shape,
    // and the callers that the shape matches the format; this keeps a
    // mismatch an error rather than a wrong table regardless.
    let invalid = || FileError::Format(SafeTensorError::TensorInvalidInfo);
    if rows.checked_mul(row_bytes) != Some(data.len()) {
        return Err(invalid());
    }
    OwnedTable::from_le_bytes(format, dim, data).map_err(|_| invalid())
}

/// A table lent to the safetensors serializer.
struct TableView<'a> {
    table: TableRef<'a>,
    shape: [usize; 2],
}

impl<'a> TableView<'a> {
    /// The table as a `[rows, dim]` tensor of values, or a
    /// `[rows, row_bytes]` tensor of packed rows.
    fn new(table: TableRef<'a>) -> Self {
        let columns = match table.data() {
            Data::Packed(packed) => packed.row_bytes(),
            Data::F32(_) | Data::F16(_) | Data::Bf16(_) => table.dim(),
        };
        TableView {
            table,
            shape: [table.rows(), columns],
        }
    }
}

impl View for TableView<'_> {
    fn dtype(&self) -> Dtype {
        match self.table.data() {
            Data::F32(_) => Dtype::F32,
            Data::F16(_) => Dtype::F16,
            Data::Bf16(_) => Dtype::BF16,
            Data::Packed(_) => Dtype::U8,
        }
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match self.table.data() {
            Data::F32(values) => little_endian(values, |x| x.to_le_bytes()),
            Data::F16(values) => little_endian(values, |x| x.to_le_bytes()),
            Data::Bf16(values) => little_endian(values, |x| x.to_le_bytes()),
            Data::Packed(packed) => Cow::Borrowed(packed.bytes()),
        }
    }

    fn data_len(&self) -> usize {
        self.table.byte_len()
    }
}

/// `values` as little-endian bytes: as they lie in memory on a
/// little-endian target, each value byte-swapped into a copy on a
/// big-endian one.
fn little_endian<T: bytemuck::NoUninit, const N: usize>(
    values: &[T],
    to_le_bytes: impl Fn(&T) -> [u8; N],
) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(values))
    } else {
        Cow::Owned(values.iter().flat_map(to_le_bytes).collect())
    }
}

/// Puts `metadata` into the header of `file`, a safetensors file the
/// serializer wrote without metadata: as the header's first member, its
/// entries in key order (note 1 of the file's docs).
fn insert_metadata(
    file: &mut Vec<u8>,
    metadata: &BTreeMap<String, String>,
) -> Result<(), FileError> {
    // The serializer's own output; an error rather than a panic regardless.
    let malformed = || FileError::Format(SafeTensorError::InvalidHeaderLength);
    let header_len = file
        .get(..HEADER_LEN_BYTES)
        .and_then(|b| <[u8; HEADER_LEN_BYTES]>::try_from(b).ok())
        .and_then(|b| usize::try_from(u64::from_le_bytes(b)).ok())
        .ok_or_else(malformed)?;
    let header_end = HEADER_LEN_BYTES
        .checked_add(header_len)
        .ok_or_else(malformed)?;
    let header = file
        .get(HEADER_LEN_BYTES..header_end)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(malformed)?;
    // `{...}` padded with spaces: the members between the braces.
    let members = header
        .trim_end_matches(' ')
        .strip_prefix('{')
        .and_then(|h| h.strip_suffix('}'))
        .ok_or_else(malformed)?;

    let mut new_header = String::with_capacity(header.len() + 64 * metadata.len());
    new_header.push('{');
    push_json_string(&mut new_header, METADATA_KEY);
    new_header.push_str(":{");
    for (k, (key, value)) in metadata.iter().enumerate() {
        if k > 0 {
            new_header.push(',');
        }
        push_json_string(&mut new_header, key);
        new_header.push(':');
        push_json_string(&mut new_header, value);
    }
    new_header.push('}');
    if !members.is_empty() {
        new_header.push(',');
    }
    new_header.push_str(members);
    new_header.push('}');
    // Padded as the serializer pads, so the data starts 8-byte aligned.
    while !new_header.len().is_multiple_of(HEADER_LEN_BYTES) {
        new_header.push(' ');
    }

    let new_len = (new_header.len() as u64).to_le_bytes();
    file.splice(
        ..header_end,
        new_len.into_iter().chain(new_header.into_bytes()),
    );
    Ok(())
}

/// Appends `text` to `out` as a JSON string, escaped as `serde_json` (the
/// serializer's JSON writer) escapes it.
fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' ' => {
                // Writing to a `String` cannot fail.
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
