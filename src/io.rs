//! Embedding tables in [safetensors](https://huggingface.co/docs/safetensors) files.
//!
//! A safetensors file is an 8-byte little-endian header length, a JSON header
//! that gives each tensor's name, dtype, shape and byte range, then the raw
//! little-endian data. This module writes and reads embedding tables through
//! the `safetensors` crate's own parser and serializer: `f32` tables as F32
//! tensors of shape `[num_embeddings, embedding_dim]` ([`save`], [`load`],
//! [`Table`]), and tables of every [`Format`] as the tensors PyTorch holds
//! them in ([`save_tables`], [`load_table`], [`load_packed`],
//! [`OwnedTable`]; see [below](#tables-of-every-format)).
//!
//! ```
//! use embedding_kernels::io;
//!
//! let words: Vec<f32> = (0..12).map(|x| x as f32).collect(); // 4 rows of 3
//! let positions = vec![0.5f32; 2 * 3];                       // 2 rows of 3
//! let bytes = io::to_bytes(&[("words", &words, 3), ("positions", &positions, 3)])?;
//!
//! let table = io::from_bytes(&bytes, "words")?;
//! assert_eq!((table.num_embeddings, table.embedding_dim), (4, 3));
//! assert_eq!(table.weight, words);
//!
//! // A name the file does not hold: the error lists the names it does.
//! let err = io::from_bytes(&bytes, "word_embeddings").unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "no tensor named `word_embeddings` in the file; it holds `positions`, `words`"
//! );
//! # Ok::<(), io::FileError>(())
//! ```
//!
//! # Checkpoints of other libraries
//!
//! [`load`] and [`from_bytes`] read one tensor and ignore the others, whatever
//! their dtype or shape, so the word embeddings of a Hugging Face checkpoint
//! (`embeddings.word_embeddings.weight`, say, beside an I64
//! `embeddings.position_ids` and 1-D LayerNorm weights) load as they are. A
//! tensor that is not F32 is [`FileError::WrongDtype`] (no conversion is
//! done), one that is not 2-D is [`FileError::WrongShape`].
//!
//! [`load_all`] is the strict one: it returns every tensor of the file as a
//! table, sorted by name, and fails on the first one (in that order) that is
//! not a 2-D F32 tensor. It is meant for files this module wrote; for a
//! mixed checkpoint, load the tensors you want by name.
//!
//! # Tables of every format
//!
//! [`save_tables`] writes [`OwnedTable`]s of any [`Format`], each as one
//! tensor, in the dtype and shape PyTorch keeps that format in:
//!
//! | format | dtype | shape | `__metadata__` entries |
//! | --- | --- | --- | --- |
//! | `f32` | `F32` | `[rows, dim]` | none |
//! | `f16` | `F16` | `[rows, dim]` | none |
//! | `bf16` | `BF16` | `[rows, dim]` | none |
//! | `int8` | `U8` | `[rows, dim + 8]` | `"<name>.format": "int8"`, `"<name>.dim": "<dim>"` |
//! | `int4` | `U8` | `[rows, ceil(dim / 2) + 4]` | `"<name>.format": "int4"`, `"<name>.dim": "<dim>"` |
//! | `int2` | `U8` | `[rows, ceil(dim / 4) + 4]` | `"<name>.format": "int2"`, `"<name>.dim": "<dim>"` |
//!
//! A packed tensor is the table's packed rows as they are (the layouts are
//! in [`formats`](crate::formats)): the `uint8` tensor
//! `torch.ops.quantized.embedding_bag_byte_prepack` (`int8`),
//! `embedding_bag_4bit_prepack` (`int4`) and `embedding_bag_2bit_prepack`
//! (`int2`) return. Its shape does not say how it is packed, nor (at 4 and
//! 2 bits) how many values a row holds, so the file's free-form metadata
//! says it: under the key `<name>.format` the format's
//! [name](Format::name), under `<name>.dim` the row width in decimal
//! (`<name>` being the tensor's name). The `f32`, `f16` and `bf16` tensors
//! need no metadata and get none, so a file of `f32` tables only is byte for
//! byte the file [`save`] writes; the metadata entries are written sorted
//! by key, so the same tables always give the same bytes.
//!
//! [`load_table`] reads the tensor back as the table it was: F32, F16 and
//! BF16 tensors by their dtype (their metadata is not read), U8 tensors by
//! their metadata, checked against the shape. A packed tensor written
//! without that metadata, as `safetensors.torch.save_file({"w": packed})`
//! writes one, is read by [`load_packed`], which takes the format and the
//! width from the caller instead. A file written from Python can also carry
//! the metadata itself:
//!
//! ```python
//! packed = torch.ops.quantized.embedding_bag_4bit_prepack(weight)
//! save_file({"w": packed}, "t.safetensors",
//!           metadata={"w.format": "int4", "w.dim": str(weight.shape[1])})
//! ```
//!
//! ```
//! use embedding_kernels::formats::{Format, OwnedTable, RowWise};
//! use embedding_kernels::io;
//!
//! let weight: Vec<f32> = (0..5 * 13).map(|x| (x as f32).sin()).collect();
//! let words = OwnedTable::from_f32(&weight, 13, Format::Int4)?;
//! let halves = OwnedTable::from_f32(&weight, 13, Format::F16)?;
//! let bytes = io::tables_to_bytes(&[("words", &words), ("halves", &halves)])?;
//!
//! assert_eq!(io::table_from_bytes(&bytes, "words")?, words);
//! assert_eq!(io::table_from_bytes(&bytes, "halves")?, halves);
//! // Without the metadata, the caller says what the U8 tensor holds.
//! assert_eq!(io::packed_from_bytes(&bytes, "words", RowWise::Int4, 13)?, words);
//! // The f32-only readers still read F32 tensors only.
//! assert!(matches!(
//!     io::from_bytes(&bytes, "halves"),
//!     Err(io::FileError::WrongDtype { .. })
//! ));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Every check (dtype, shape, metadata, the packed row length against the
//! width, every size computed without overflow) runs before the table's
//! values are copied out of the file, so a wrong or hostile file is an
//! error, never a panic or a huge allocation. A `[rows, 0]` F32, F16 or
//! BF16 tensor reads as a table of width 0 and no rows, as the kernels count
//! such a table.
//!
//! # Hostile files
//!
//! A file is read in three steps, each bounded by what the previous one
//! checked, so a file that lies about itself costs little memory and is
//! refused before its claims are believed:
//!
//! 1. **The 8-byte header length.** More than [`MAX_HEADER_BYTES`]
//!    (100 MB, the cap of the `safetensors` crate) is
//!    [`FileError::HeaderTooLong`]; more than the file holds after the
//!    field is [`FileError::FileLength`]. Nothing else is read yet.
//! 2. **The header**, read (from a path) or borrowed (from bytes), then
//!    parsed in one streaming pass that keeps a few dozen bytes per tensor:
//!    its name, dtype and byte range, and the shape's element count.
//!    Shapes are kept only for the tensor asked for (every tensor for
//!    [`load_all`]), and only if they have at most [`MAX_DIMS`] dims
//!    (more is [`FileError::TooManyDims`]); metadata is kept only under the
//!    keys asked for. Then, in this order, with checked arithmetic: a name
//!    listed twice is [`FileError::DuplicateEntry`], a shape whose bits
//!    overflow `usize` [`FileError::TensorTooLarge`], a byte range that
//!    does not hold them [`FileError::TensorBytes`], ranges that do not tile
//!    the data [`FileError::DataOffsets`], a file whose length is not
//!    `8 + header + data` (summed in `u128`) [`FileError::FileLength`].
//!    A header that is not UTF-8 or not a header object is
//!    [`FileError::Format`].
//! 3. **The tensor asked for**, and only it: [`load`], [`load_table`] and
//!    [`load_packed`] seek to its range and read that much, into a buffer
//!    allocated fallibly ([`FileError::AllocationFailed`] if refused).
//!
//! So reading one table from a path costs the header (at most
//! [`MAX_HEADER_BYTES`] and at most the file's size), a few dozen bytes per
//! tensor of it, and the table (twice the table's bytes at the peak for
//! [`load_table`] and [`load_packed`], which read the bytes and then
//! convert them); from bytes, the file is borrowed and only the table is
//! allocated. A path must name a file whose length its metadata gives (a
//! regular file, not a pipe). The figures measured on hostile files are in
//! `docs/testing.md`.
//!
//! The files refused beyond what the `safetensors` crate refuses are those
//! listing a name twice (JSON would keep one of them silently) and those
//! whose tensor asked for has more than [`MAX_DIMS`] dims.
//!
//! # Bits and byte order
//!
//! Values are stored and read as IEEE-754 bit patterns in little-endian
//! order, as the format requires, on every target: a round trip keeps every
//! bit (`-0.0`, NaN payloads, signalling NaNs, subnormals). On a
//! little-endian target the tables are handed to the serializer as they lie
//! in memory; on a big-endian one each value is byte-swapped into a copy.
//!
//! # Saving is all or nothing
//!
//! [`save`] and [`to_bytes`] check every table first (names, then shape, first
//! table to last) and write nothing if one is wrong; [`save_tables`] and
//! [`tables_to_bytes`] check every name. [`save`] and [`save_tables`] then
//! serialize the whole file in memory (so they briefly need as much memory
//! again as the tables hold), write it to a temporary file in the target's
//! folder and rename that over the target: a failed save leaves no file
//! behind and an existing file as it was.
//!
//! [`OwnedTable`]: crate::formats::OwnedTable

mod any_format;
mod atomic;
mod body;
mod header;

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::File;
use std::io as stdio;
use std::path::Path;

use safetensors::{Dtype, SafeTensorError, View};

pub use any_format::{
    load_packed, load_table, packed_from_bytes, save_tables, table_from_bytes, tables_to_bytes,
};
use atomic::write_atomically;
use body::Body;
use header::{Entry, Header, Keep};
pub use header::{MAX_DIMS, MAX_HEADER_BYTES};

use crate::buffer;
use crate::error::{EmbeddingError, Operand};
use crate::formats::{Format, RowWise};
use crate::shape::table_rows;

/// The key the safetensors header keeps for the file's free-form metadata; no
/// tensor may have it as its name.
const METADATA_KEY: &str = "__metadata__";

/// A 2-D F32 tensor read from a file: an embedding table.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// The tensor's name in the file.
    pub name: String,
    /// The values, row-major: `num_embeddings × embedding_dim` of them.
    pub weight: Vec<f32>,
    /// The number of rows, the tensor's first dimension.
    ///
    /// A file may hold a tensor of shape `[rows, 0]`; it is read with
    /// `embedding_dim == 0`, an empty `weight` and `num_embeddings == rows`,
    /// but the kernels count the rows of a table with `embedding_dim == 0`
    /// as 0.
    pub num_embeddings: usize,
    /// The width of a row, the tensor's second dimension.
    pub embedding_dim: usize,
}

impl Table {
    /// The table as an entry for [`save`] and [`to_bytes`]:
    /// `(name, weight, embedding_dim)`.
    pub fn as_entry(&self) -> (&str, &[f32], usize) {
        (&self.name, &self.weight, self.embedding_dim)
    }
}

/// Everything that can go wrong reading or writing a file of tables.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// Reading or writing the file failed.
    #[error("I/O error: {0}")]
    Io(#[from] stdio::Error),

    /// The header is not UTF-8, not JSON, or not a safetensors header (a
    /// dtype it does not know, a field missing or of the wrong type, ...),
    /// or the serializer refused the tables.
    #[error("invalid safetensors data: {0}")]
    Format(#[source] SafeTensorError),

    /// The header length field gives more than [`MAX_HEADER_BYTES`].
    #[error("the file claims a header of {claimed} bytes; at most {max} are read")]
    HeaderTooLong {
        /// The length the field gives.
        claimed: u64,
        /// The longest header read, [`MAX_HEADER_BYTES`].
        max: u64,
    },

    /// The file is not as long as it says: shorter than the 8-byte header
    /// length (`expected` is then 8), than the length and the header it
    /// gives, or than `8 + header + data`; or longer than that.
    #[error("the file holds {actual} bytes, but its header says it holds {expected}")]
    FileLength {
        /// The length the header gives (or the part of it read so far).
        expected: u128,
        /// The file's length.
        actual: u64,
    },

    /// The header lists a tensor name, `__metadata__`, or a metadata key
    /// that is read, twice.
    #[error("the header lists `{key}` twice")]
    DuplicateEntry {
        /// The name or key listed twice.
        key: String,
    },

    /// A tensor's element count, or its size in bits, overflows `usize`.
    #[error("tensor `{name}`: its shape holds more {dtype} values than a usize counts in bits")]
    TensorTooLarge {
        /// The tensor's name.
        name: String,
        /// Its dtype, as the safetensors header spells it.
        dtype: String,
    },

    /// A tensor's byte range does not hold the bits its dtype and shape
    /// take (or they are not whole bytes).
    #[error(
        "tensor `{name}` takes {bits} bits by its dtype and shape, but its byte range holds {bytes} bytes"
    )]
    TensorBytes {
        /// The tensor's name.
        name: String,
        /// The bits its dtype and shape take.
        bits: usize,
        /// The bytes of its range (`end - start`).
        bytes: usize,
    },

    /// The tensors' byte ranges, in order, do not tile the data from 0:
    /// this one starts elsewhere than where the one before it ends, or ends
    /// before it starts.
    #[error(
        "tensor `{name}` spans bytes {start}..{end} of the data, where bytes from {expected_start} on come next"
    )]
    DataOffsets {
        /// The tensor's name.
        name: String,
        /// Its range's start.
        start: usize,
        /// Its range's end.
        end: usize,
        /// Where the tensor before it ends (0 for the first).
        expected_start: usize,
    },

    /// The shape of the tensor read has more than [`MAX_DIMS`] dims.
    #[error("tensor `{name}` has {dims} dims; a tensor read may have at most {max}")]
    TooManyDims {
        /// The tensor's name.
        name: String,
        /// How many dims its shape has.
        dims: usize,
        /// [`MAX_DIMS`].
        max: usize,
    },

    /// The memory for the header or the tensor could not be allocated: an
    /// [`EmbeddingError::AllocationFailed`] with the bytes asked for.
    #[error(transparent)]
    AllocationFailed(EmbeddingError),

    /// The file holds no tensor of the name asked for.
    #[error("no tensor named `{name}` in the file; it holds {}", list_names(.available))]
    MissingTensor {
        /// The name asked for.
        name: String,
        /// The names of the tensors the file does hold, sorted.
        available: Vec<String>,
    },

    /// The tensor is not F32 ([`load`], [`from_bytes`], [`load_all`],
    /// [`all_from_bytes`]).
    #[error("tensor `{name}` has dtype {dtype}, expected F32")]
    WrongDtype {
        /// The tensor's name.
        name: String,
        /// Its dtype, as the safetensors header spells it (`I64`, `F16`, ...).
        dtype: String,
    },

    /// The tensor is not 2-D.
    #[error("tensor `{name}` has shape {shape:?}, expected 2-D [num_embeddings, embedding_dim]")]
    WrongShape {
        /// The tensor's name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },

    /// The tensor's dtype is not one the table asked for is stored as:
    /// F32, F16, BF16 or U8 for [`load_table`], U8 for [`load_packed`].
    #[error("tensor `{name}` has dtype {dtype}, expected {expected}")]
    UnsupportedDtype {
        /// The tensor's name.
        name: String,
        /// Its dtype, as the safetensors header spells it.
        dtype: String,
        /// The dtypes that would do.
        expected: &'static str,
    },

    /// A U8 tensor read by [`load_table`] has no `<name>.format` in the
    /// file's metadata: nothing says how its rows are packed.
    #[error(
        "tensor `{name}` is U8 but the file's metadata has no `{name}.format` saying how its rows \
         are packed; load_packed reads it given the format and the width"
    )]
    MissingFormat {
        /// The tensor's name.
        name: String,
    },

    /// The `<name>.format` of a U8 tensor is not `int8`, `int4` or `int2`.
    #[error(
        "the file's metadata gives tensor `{name}` the format `{format}`; \
         a U8 tensor holds int8, int4 or int2 rows"
    )]
    UnknownFormat {
        /// The tensor's name.
        name: String,
        /// The format the metadata gives, as it gives it.
        format: String,
    },

    /// A U8 tensor read by [`load_table`] has no `<name>.dim` in the file's
    /// metadata: nothing says how many values a row holds.
    #[error(
        "tensor `{name}` holds {} rows but the file's metadata has no `{name}.dim` \
         saying how many values a row holds",
        Format::from(*.format)
    )]
    MissingDim {
        /// The tensor's name.
        name: String,
        /// Its format, from the metadata.
        format: RowWise,
    },

    /// The `<name>.dim` of a U8 tensor is not a row width: a decimal
    /// number without sign, spaces or leading zeros that fits in `usize`.
    #[error(
        "the file's metadata gives tensor `{name}` the width `{dim}`, \
         which is not a decimal number of values"
    )]
    BadDim {
        /// The tensor's name.
        name: String,
        /// The width the metadata gives, as it gives it.
        dim: String,
    },

    /// A row of the tensor's format and width would take more bytes than
    /// `usize` counts.
    #[error("tensor `{name}`: a row of {dim} {format} values takes more bytes than a usize counts")]
    RowTooLong {
        /// The tensor's name.
        name: String,
        /// The format.
        format: Format,
        /// The width.
        dim: usize,
    },

    /// A packed tensor's second dimension is not the length of a packed row
    /// of its format and width.
    #[error(
        "tensor `{name}` has rows of {got} bytes, but {} rows of {dim} values take \
         {expected_row_bytes} bytes",
        Format::from(*.format)
    )]
    PackedLayout {
        /// The tensor's name.
        name: String,
        /// Its format (from the metadata or the caller).
        format: RowWise,
        /// Its width (from the metadata or the caller).
        dim: usize,
        /// The bytes of a packed row of that format and width,
        /// [`RowWise::row_bytes`].
        expected_row_bytes: usize,
        /// The tensor's second dimension.
        got: usize,
    },

    /// A table given to [`save`] or [`to_bytes`] is not a whole number of
    /// rows.
    #[error("table `{name}` cannot be saved: {source}")]
    Table {
        /// The table's name.
        name: String,
        /// What is wrong with its shape.
        source: EmbeddingError,
    },

    /// Two tables given to [`save`], [`to_bytes`], [`save_tables`] or
    /// [`tables_to_bytes`] have the same name.
    #[error("two tables are named `{name}`; the names in a file must be unique")]
    DuplicateName {
        /// The name given twice.
        name: String,
    },

    /// A table given to a save is named `__metadata__`,
    /// which the safetensors header keeps for the file's metadata.
    #[error("a table cannot be named `{name}`: safetensors keeps that key for the file's metadata")]
    ReservedName {
        /// The name given.
        name: String,
    },
}

impl From<SafeTensorError> for FileError {
    /// An I/O error inside the safetensors crate is [`FileError::Io`];
    /// everything else is [`FileError::Format`].
    fn from(error: SafeTensorError) -> Self {
        match error {
            SafeTensorError::IoError(error) => FileError::Io(error),
            other => FileError::Format(other),
        }
    }
}

/// `` `a`, `b` ``, or `no tensors`.
fn list_names(names: &[String]) -> String {
    if names.is_empty() {
        return "no tensors".to_owned();
    }
    let quoted: Vec<String> = names.iter().map(|name| format!("`{name}`")).collect();
    quoted.join(", ")
}

/// Writes `tables` to the safetensors file at `path`, each
/// `(name, weight, embedding_dim)` as an F32 tensor of shape
/// `[weight.len() / embedding_dim, embedding_dim]` (`[0, 0]` for an empty
/// table with `embedding_dim == 0`).
///
/// Every table is checked before anything is written; on any error no file
/// is created and an existing file at `path` is left as it was (see the
/// [module docs](self#saving-is-all-or-nothing)).
///
/// # Errors
///
/// The first problem found, checking the tables in order, each by name and
/// then shape: [`FileError::ReservedName`], [`FileError::DuplicateName`],
/// [`FileError::Table`] (not a whole number of rows, or `embedding_dim == 0`
/// with values); then [`FileError::Io`] if the file cannot be written.
pub fn save(path: impl AsRef<Path>, tables: &[(&str, &[f32], usize)]) -> Result<(), FileError> {
    let bytes = to_bytes(tables)?;
    write_atomically(path.as_ref(), &bytes)?;
    Ok(())
}

/// The bytes of the safetensors file [`save`] would write.
///
/// # Errors
///
/// As [`save`], less [`FileError::Io`].
pub fn to_bytes(tables: &[(&str, &[f32], usize)]) -> Result<Vec<u8>, FileError> {
    let views = f32_views(tables)?;
    Ok(safetensors::serialize(views, None)?)
}

/// Reads the table `name` from the safetensors file at `path`: the header,
/// then that tensor's bytes only (see the
/// [module docs](self#hostile-files)).
///
/// The file's other tensors may have any dtype and shape.
///
/// # Errors
///
/// [`FileError::Io`] if the file cannot be read; the header's errors
/// ([`FileError::HeaderTooLong`], [`FileError::FileLength`],
/// [`FileError::Format`], [`FileError::DuplicateEntry`],
/// [`FileError::TensorTooLarge`], [`FileError::TensorBytes`],
/// [`FileError::DataOffsets`], in the order of the
/// [module docs](self#hostile-files)); [`FileError::MissingTensor`] (with the
/// names the file holds) if it has no tensor `name`;
/// [`FileError::WrongDtype`] if that tensor is not F32, then
/// [`FileError::TooManyDims`] or [`FileError::WrongShape`] if it is not
/// 2-D; [`FileError::AllocationFailed`] if its memory is refused.
pub fn load(path: impl AsRef<Path>, name: &str) -> Result<Table, FileError> {
    let mut file = File::open(path)?;
    let keep = Keep::One { name, keys: &[] };
    let header = header::from_file(&mut file, &keep)?;
    read_table(&header, name, &mut Body::File(&mut file))
}

/// Reads the table `name` from the bytes of a safetensors file.
///
/// # Errors
///
/// As [`load`], less [`FileError::Io`].
pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Table, FileError> {
    let keep = Keep::One { name, keys: &[] };
    let header = header::from_bytes(bytes, &keep)?;
    read_table(&header, name, &mut Body::Bytes(bytes))
}

/// Reads every tensor of the safetensors file at `path` as a table, sorted
/// by name.
///
/// This is strict on purpose: every tensor must be a 2-D F32 tensor. To read
/// some tensors of a file that holds others (a model checkpoint), use
/// [`load`] with their names.
///
/// # Errors
///
/// [`FileError::Io`] and the header's errors as for [`load`]; then
/// [`FileError::WrongDtype`], [`FileError::TooManyDims`] or
/// [`FileError::WrongShape`] for the first tensor, in name order, that is
/// not a 2-D F32 tensor; [`FileError::AllocationFailed`] if the memory of a
/// table is refused.
pub fn load_all(path: impl AsRef<Path>) -> Result<Vec<Table>, FileError> {
    let mut file = File::open(path)?;
    let header = header::from_file(&mut file, &Keep::All)?;
    read_all(&header, &mut Body::File(&mut file))
}

/// Reads every tensor of the bytes of a safetensors file as a table, sorted
/// by name (see [`load_all`]).
///
/// # Errors
///
/// As [`load_all`], less [`FileError::Io`].
pub fn all_from_bytes(bytes: &[u8]) -> Result<Vec<Table>, FileError> {
    let header = header::from_bytes(bytes, &Keep::All)?;
    read_all(&header, &mut Body::Bytes(bytes))
}

/// The tensor `name` of `header`, or the error that lists the names.
fn find<'h>(header: &'h Header, name: &str) -> Result<&'h Entry, FileError> {
    header.get(name).ok_or_else(|| FileError::MissingTensor {
        name: name.to_owned(),
        available: header.names(),
    })
}

/// Reads the table `name` of a checked header from `body`.
fn read_table(header: &Header, name: &str, body: &mut Body<'_>) -> Result<Table, FileError> {
    let entry = find(header, name)?;
    let [num_embeddings, embedding_dim] = f32_shape(entry)?;
    read_f32(header, entry, num_embeddings, embedding_dim, body)
}

/// Reads every tensor of a checked header from `body` as a table, in name
/// order, once every tensor is known to be one.
fn read_all(header: &Header, body: &mut Body<'_>) -> Result<Vec<Table>, FileError> {
    let shapes = header
        .tensors
        .iter()
        .map(f32_shape)
        .collect::<Result<Vec<_>, _>>()?;
    let mut tables =
        buffer::with_capacity(shapes.len(), "tables").map_err(FileError::AllocationFailed)?;
    for (entry, [rows, dim]) in header.tensors.iter().zip(shapes) {
        tables.push(read_f32(header, entry, rows, dim, body)?);
    }
    Ok(tables)
}

/// The `[num_embeddings, embedding_dim]` of an F32 tensor: dtype first,
/// then shape.
fn f32_shape(entry: &Entry) -> Result<[usize; 2], FileError> {
    if entry.dtype != Dtype::F32 {
        return Err(FileError::WrongDtype {
            name: entry.name.clone(),
            dtype: entry.dtype.to_string(),
        });
    }
    two_d(entry)
}

/// The shape of a tensor read, as `[rows, columns]`, unless it is not 2-D.
fn two_d(entry: &Entry) -> Result<[usize; 2], FileError> {
    // Every tensor read has its shape kept; an error rather than a panic
    // regardless.
    let shape = entry
        .shape
        .as_deref()
        .ok_or(FileError::Format(SafeTensorError::TensorInvalidInfo))?;
    if shape.count > MAX_DIMS {
        return Err(FileError::TooManyDims {
            name: entry.name.clone(),
            dims: shape.count,
            max: MAX_DIMS,
        });
    }
    match *shape.dims {
        [rows, columns] => Ok([rows, columns]),
        _ => Err(FileError::WrongShape {
            name: entry.name.clone(),
            shape: shape.dims.clone(),
        }),
    }
}

/// Reads the F32 tensor `entry`, of shape `[rows, dim]`, into a table.
fn read_f32(
    header: &Header,
    entry: &Entry,
    rows: usize,
    dim: usize,
    body: &mut Body<'_>,
) -> Result<Table, FileError> {
    // The header check has matched the byte range with dtype and shape;
    // this keeps a mismatch an error rather than a wrong table regardless.
    let len = rows
        .checked_mul(dim)
        .filter(|len| len.checked_mul(size_of::<f32>()) == entry.end.checked_sub(entry.start))
        .ok_or(FileError::Format(SafeTensorError::TensorInvalidInfo))?;
    let mut weight = buffer::zeroed::<f32>(len, "table").map_err(FileError::AllocationFailed)?;
    body.read_into(header, entry, bytemuck::cast_slice_mut(&mut weight))?;
    if cfg!(target_endian = "big") {
        for x in &mut weight {
            *x = f32::from_bits(u32::from_le(x.to_bits()));
        }
    }
    Ok(Table {
        name: entry.name.clone(),
        weight,
        num_embeddings: rows,
        embedding_dim: dim,
    })
}

/// A table lent to the safetensors serializer.
struct F32View<'a> {
    shape: [usize; 2],
    data: &'a [f32],
}

impl View for F32View<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        if cfg!(target_endian = "little") {
            // In memory the values already are little-endian bytes.
            Cow::Borrowed(bytemuck::cast_slice(self.data))
        } else {
            Cow::Owned(self.data.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
    }

    fn data_len(&self) -> usize {
        size_of_val(self.data)
    }
}

/// Checks every table (name, then shape, first to last) and lends them to
/// the serializer.
fn f32_views<'a>(
    tables: &[(&'a str, &'a [f32], usize)],
) -> Result<Vec<(&'a str, F32View<'a>)>, FileError> {
    let mut names = HashSet::with_capacity(tables.len());
    let mut views = Vec::with_capacity(tables.len());
    for &(name, data, dim) in tables {
        check_name(&mut names, name)?;
        let rows =
            table_rows(data.len(), dim, Operand::Table).map_err(|source| FileError::Table {
                name: name.to_owned(),
                source,
            })?;
        views.push((
            name,
            F32View {
                shape: [rows, dim],
                data,
            },
        ));
    }
    Ok(views)
}

/// Checks that `name` may name a tensor and is not in `names` (the names of
/// the tables before it), then adds it.
fn check_name<'a>(names: &mut HashSet<&'a str>, name: &'a str) -> Result<(), FileError> {
    if name == METADATA_KEY {
        return Err(FileError::ReservedName {
            name: name.to_owned(),
        });
    }
    if !names.insert(name) {
        return Err(FileError::DuplicateName {
            name: name.to_owned(),
        });
    }
    Ok(())
}
