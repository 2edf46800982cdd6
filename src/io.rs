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

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs;
use std::io as stdio;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensorError, SafeTensors, View};

pub use any_format::{
    load_packed, load_table, packed_from_bytes, save_tables, table_from_bytes, tables_to_bytes,
};
use atomic::write_atomically;

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

    /// The bytes are not a valid safetensors file (truncated, a header that
    /// is not JSON, byte ranges that do not match the shapes, ...), or the
    /// serializer refused the tables.
    #[error("invalid safetensors data: {0}")]
    Format(#[source] SafeTensorError),

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
    #[error(
        "tensor `{name}`: a row of {dim} {format} values takes more bytes than a usize counts"
    )]
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
    #[error(
        "a table cannot be named `{name}`: safetensors keeps that key for the file's metadata"
    )]
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

/// Reads the table `name` from the safetensors file at `path`.
///
/// The file's other tensors may have any dtype and shape.
///
/// # Errors
///
/// [`FileError::Io`] if the file cannot be read; [`FileError::Format`] if it
/// is not a valid safetensors file; [`FileError::MissingTensor`] (with the
/// names the file holds) if it has no tensor `name`; [`FileError::WrongDtype`]
/// if that tensor is not F32, then [`FileError::WrongShape`] if it is not 2-D.
pub fn load(path: impl AsRef<Path>, name: &str) -> Result<Table, FileError> {
    let bytes = fs::read(path)?;
    from_bytes(&bytes, name)
}

/// Reads the table `name` from the bytes of a safetensors file.
///
/// # Errors
///
/// As [`load`], less [`FileError::Io`].
pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Table, FileError> {
    let file = SafeTensors::deserialize(bytes)?;
    match file.tensor(name) {
        Ok(view) => table(name, &view),
        Err(SafeTensorError::TensorNotFound(_)) => Err(FileError::MissingTensor {
            name: name.to_owned(),
            available: sorted_names(&file),
        }),
        Err(error) => Err(error.into()),
    }
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
/// [`FileError::Io`], [`FileError::Format`] as for [`load`]; then
/// [`FileError::WrongDtype`] or [`FileError::WrongShape`] for the first
/// tensor, in name order, that is not a 2-D F32 tensor.
pub fn load_all(path: impl AsRef<Path>) -> Result<Vec<Table>, FileError> {
    let bytes = fs::read(path)?;
    all_from_bytes(&bytes)
}

/// Reads every tensor of the bytes of a safetensors file as a table, sorted
/// by name (see [`load_all`]).
///
/// # Errors
///
/// As [`load_all`], less [`FileError::Io`].
pub fn all_from_bytes(bytes: &[u8]) -> Result<Vec<Table>, FileError> {
    let file = SafeTensors::deserialize(bytes)?;
    let mut tensors: Vec<(&str, TensorView<'_>)> = file.iter().collect();
    tensors.sort_unstable_by(|a, b| a.0.cmp(b.0));
    tensors
        .iter()
        .map(|(name, view)| table(name, view))
        .collect()
}

/// The names of the tensors in `file`, sorted.
fn sorted_names(file: &SafeTensors<'_>) -> Vec<String> {
    let mut names: Vec<String> = file.names().into_iter().map(str::to_owned).collect();
    names.sort_unstable();
    names
}

/// Converts one tensor of a file into a table: dtype first, then shape.
fn table(name: &str, view: &TensorView<'_>) -> Result<Table, FileError> {
    if view.dtype() != Dtype::F32 {
        return Err(FileError::WrongDtype {
            name: name.to_owned(),
            dtype: view.dtype().to_string(),
        });
    }
    let &[num_embeddings, embedding_dim] = view.shape() else {
        return Err(FileError::WrongShape {
            name: name.to_owned(),
            shape: view.shape().to_vec(),
        });
    };
    let data = view.data();
    // The parser has checked that the byte range matches dtype and shape;
    // this keeps a mismatch an error rather than a wrong table regardless.
    let expected_bytes = num_embeddings
        .checked_mul(embedding_dim)
        .and_then(|len| len.checked_mul(size_of::<f32>()));
    if expected_bytes != Some(data.len()) {
        return Err(FileError::Format(SafeTensorError::TensorInvalidInfo));
    }
    let weight = data
        .chunks_exact(size_of::<f32>())
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok(Table {
        name: name.to_owned(),
        weight,
        num_embeddings,
        embedding_dim,
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
