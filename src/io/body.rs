//! Where a tensor's bytes come from once the header is checked: the bytes
//! of a file in memory, or the file itself, read at the tensor's range only.

use std::borrow::Cow;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use safetensors::SafeTensorError;

use super::FileError;
use super::header::{Entry, Header};
use crate::buffer;

/// The data of a file whose header has been read.
pub(super) enum Body<'a> {
    /// The whole file, in memory.
    Bytes(&'a [u8]),
    /// The file, read at each tensor's range.
    File(&'a mut File),
}

impl<'a> Body<'a> {
    /// Copies the bytes of `entry` into `out`, which holds exactly as many.
    pub fn read_into(
        &mut self,
        header: &Header,
        entry: &Entry,
        out: &mut [u8],
    ) -> Result<(), FileError> {
        match self {
            Body::Bytes(bytes) => {
                let data = slice(bytes, header, entry)?;
                if data.len() != out.len() {
                    return Err(mismatch());
                }
                out.copy_from_slice(data);
            }
            Body::File(file) => {
                if len(entry)? != out.len() {
                    return Err(mismatch());
                }
                file.seek(SeekFrom::Start(offset(header, entry)?))?;
                file.read_exact(out)?;
            }
        }
        Ok(())
    }

    /// The bytes of `entry`: borrowed from memory, or read from the file
    /// into a buffer of their size.
    pub fn bytes(&mut self, header: &Header, entry: &Entry) -> Result<Cow<'a, [u8]>, FileError> {
        match self {
            Body::Bytes(bytes) => Ok(Cow::Borrowed(slice(bytes, header, entry)?)),
            Body::File(_) => {
                let mut out = buffer::zeroed::<u8>(len(entry)?, "tensor")
                    .map_err(FileError::AllocationFailed)?;
                self.read_into(header, entry, &mut out)?;
                Ok(Cow::Owned(out))
            }
        }
    }
}

/// The bytes of `entry` in the file `bytes`.
fn slice<'a>(bytes: &'a [u8], header: &Header, entry: &Entry) -> Result<&'a [u8], FileError> {
    // The header check has matched every range with the file's length;
    // this keeps a mismatch an error rather than a panic regardless.
    usize::try_from(header.data_start)
        .ok()
        .and_then(|data_start| bytes.get(data_start..))
        .and_then(|data| data.get(entry.start..entry.end))
        .ok_or_else(mismatch)
}

/// Where `entry` starts in the file.
fn offset(header: &Header, entry: &Entry) -> Result<u64, FileError> {
    u64::try_from(entry.start)
        .ok()
        .and_then(|start| header.data_start.checked_add(start))
        .ok_or_else(mismatch)
}

/// The bytes of `entry`.
fn len(entry: &Entry) -> Result<usize, FileError> {
    entry.end.checked_sub(entry.start).ok_or_else(mismatch)
}

fn mismatch() -> FileError {
    FileError::Format(SafeTensorError::MetadataIncompleteBuffer)
}
