//! Embedding tables in [safetensors](https://huggingface.co/docs/safetensors) files.
//!
//! A safetensors file is an 8-byte little-endian header length, a JSON header
//! that gives each tensor's name, dtype, shape and byte range, then the raw
//! little-endian data. This module writes and reads embedding tables as F32
//! tensors of shape `[num_embeddings, embedding_dim]`, through the
//! `safetensors` crate's own parser and serializer.
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
//! table to last) and write nothing if one is wrong. [`save`] then serializes
//! the whole file in memory (so it briefly needs as much memory again as the
//! tables hold), writes it to a temporary file in the target's folder and
//! renames that over the target: a failed save leaves no file behind and an
//! existing file as it was.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self as stdio, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensorError, SafeTensors, View};

use crate::error::{EmbeddingError, Operand};
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

    /// The tensor is not F32.
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

    /// A table given to [`save`] or [`to_bytes`] is not a whole number of
    /// rows.
    #[error("table `{name}` cannot be saved: {source}")]
    Table {
        /// The table's name.
        name: String,
        /// What is wrong with its shape.
        source: EmbeddingError,
    },

    /// Two tables given to [`save`] or [`to_bytes`] have the same name.
    #[error("two tables are named `{name}`; the names in a file must be unique")]
    DuplicateName {
        /// The name given twice.
        name: String,
    },

    /// A table given to [`save`] or [`to_bytes`] is named `__metadata__`,
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

/// Tells apart the temporary files of saves running at once in one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to a new file beside `path`, then renames it to `path`;
/// removes the new file if anything fails.
fn write_atomically(path: &Path, bytes: &[u8]) -> stdio::Result<()> {
    let file_name = path.file_name().ok_or_else(|| {
        stdio::Error::new(
            stdio::ErrorKind::InvalidInput,
            format!("`{}` does not name a file", path.display()),
        )
    })?;
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    let (temp_path, file) = create_temp_file(folder, &file_name.to_string_lossy())?;
    let written = write_then_rename(file, bytes, &temp_path, path);
    if written.is_err() {
        // The write's error is the one to report; the temporary file may
        // already be gone.
        let _ = fs::remove_file(&temp_path);
    }
    written
}

/// Writes `bytes` to `file` (at `temp_path`), flushes it to the disk, closes
/// it and renames it to `path`.
fn write_then_rename(
    mut file: File,
    bytes: &[u8],
    temp_path: &Path,
    path: &Path,
) -> stdio::Result<()> {
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(temp_path, path)
}

/// Creates a file that did not exist, named after `file_name`, in `folder`.
fn create_temp_file(folder: &Path, file_name: &str) -> stdio::Result<(PathBuf, File)> {
    const ATTEMPTS: u32 = 64;
    let mut last_error = None;
    for _ in 0..ATTEMPTS {
        let serial = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp_path = folder.join(format!(
            ".{file_name}.{pid}.{serial}.tmp",
            pid = std::process::id()
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp_path)
        {
            Ok(file) => return Ok((temp_path, file)),
            Err(error) if error.kind() == stdio::ErrorKind::AlreadyExists => {
                last_error = Some(error);
            }
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| stdio::Error::other("no temporary file name was free")))
}
