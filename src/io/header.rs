//! Reading a safetensors header from an untrusted file at a cost bounded by
//! the file's own size: the checks of the [module docs](super#hostile-files).
//!
//! ```text
//! length:  8 bytes, little-endian -> at most MAX_HEADER_BYTES -> the header
//!          must fit in the file (checked before it is read or borrowed)
//! header:  UTF-8 -> one streaming pass of serde_json over the JSON object:
//!          per tensor: its name, its dtype, its byte range, and of its shape
//!          only the bits (checked product); the dims themselves
//!          are kept (at most MAX_DIMS of them) for the tensors asked for
//!          per metadata entry: kept only under the keys asked for
//! after:   the names are unique (sorted by name) -> each tensor's bits
//!          (checked product) fit its byte range -> the ranges tile the
//!          data from 0 (sorted by range) -> back in name order, the order
//!          lookups use -> 8 + header + data is the file's length, in u128
//! ```
//!
//! 1. **Why not `SafeTensors::read_metadata`.** Its header type flattens
//!    the tensors into a map (`#[serde(flatten)]`), so serde first buffers
//!    every JSON value of the header as a `Content` (tens of bytes per
//!    number): a 100 MB header of one long shape takes about 2 GB before
//!    any check. It also keeps every shape whole, and with overflow checks
//!    on it panics adding a data end near `usize::MAX` to the header length.
//!    This pass keeps a few dozen bytes per tensor and counts in `u128`
//!    where a sum can pass `usize`.
//! 2. **Same files.** It accepts the files that parser accepts (the same
//!    length cap, dtypes, overflow rule for shapes, tiling of the data, and
//!    a `null` metadata), and refuses, beyond them, a name listed twice
//!    (the JSON object would otherwise keep one of the two silently) and a
//!    tensor asked for whose shape has more than [`MAX_DIMS`] dims.
//! 3. **Typed errors out of serde.** A check that fails inside the pass
//!    stores its [`FileError`] in a slot and stops serde with a placeholder
//!    error; the slot's error is the one returned.

use std::fs::File;
use std::io::Read;

use safetensors::{Dtype, SafeTensorError};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{FileError, METADATA_KEY};
use crate::buffer;

/// The longest header read, in bytes: `safetensors`' own cap, so every
/// file that crate reads, this module reads.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The most dims the shape of a tensor that is read may have (NumPy's
/// limit). The shapes of the other tensors are counted, not kept, and may
/// have any number.
pub const MAX_DIMS: usize = 64;

/// The bytes of the header length field.
pub(super) const LEN_BYTES: usize = size_of::<u64>();

/// Which tensors' shapes and which metadata entries to keep.
pub(super) enum Keep<'a> {
    /// The tensor `name` and the metadata under `keys`.
    One {
        /// The tensor asked for.
        name: &'a str,
        /// The metadata keys asked for.
        keys: &'a [String],
    },
    /// Every tensor, no metadata.
    All,
}

impl Keep<'_> {
    fn tensor(&self, name: &str) -> bool {
        match self {
            Keep::One { name: wanted, .. } => *wanted == name,
            Keep::All => true,
        }
    }

    fn metadata(&self, key: &str) -> bool {
        match self {
            Keep::One { keys, .. } => keys.iter().any(|k| k == key),
            Keep::All => false,
        }
    }
}

/// A parsed and checked header.
pub(super) struct Header {
    /// Where the data starts in the file: `8 + header length`.
    pub data_start: u64,
    /// Every tensor, sorted by name (names are unique).
    pub tensors: Vec<Entry>,
    /// The metadata entries kept, in file order (keys are unique).
    pub metadata: Vec<(String, String)>,
}

/// One tensor of the header.
pub(super) struct Entry {
    pub name: String,
    pub dtype: Dtype,
    /// Its byte range in the data.
    pub start: usize,
    pub end: usize,
    /// The bits its dtype and shape take, `None` if they overflow.
    bits: Option<usize>,
    /// Its shape, for the tensors kept.
    pub shape: Option<Box<Shape>>,
}

/// The shape of a tensor that is read.
pub(super) struct Shape {
    /// Its dims, or the first [`MAX_DIMS`] of them.
    pub dims: Vec<usize>,
    /// How many dims it has.
    pub count: usize,
}

impl Header {
    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        let at = self
            .tensors
            .binary_search_by(|entry| entry.name.as_str().cmp(name))
            .ok()?;
        self.tensors.get(at)
    }

    /// Every tensor's name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tensors
            .iter()
            .map(|entry| entry.name.clone())
            .collect()
    }

    /// The metadata kept under `key`.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads the header of the file `bytes`, borrowing it.
pub(super) fn from_bytes(bytes: &[u8], keep: &Keep<'_>) -> Result<Header, FileError> {
    let actual = bytes.len() as u64;
    let len_field = bytes
        .get(..LEN_BYTES)
        .and_then(|b| <[u8; LEN_BYTES]>::try_from(b).ok())
        .ok_or(FileError::FileLength {
            expected: LEN_BYTES as u128,
            actual,
        })?;
    let len = header_len(len_field, actual)?;
    let header = bytes
        .get(LEN_BYTES..LEN_BYTES + len)
        .ok_or(FileError::FileLength {
            expected: (LEN_BYTES + len) as u128,
            actual,
        })?;
    parse(header, actual, keep)
}

/// Reads the header of `file`, from its start: the length field, then the
/// header it gives, and nothing past it.
pub(super) fn from_file(file: &mut File, keep: &Keep<'_>) -> Result<Header, FileError> {
    let actual = file.metadata()?.len();
    if actual < LEN_BYTES as u64 {
        return Err(FileError::FileLength {
            expected: LEN_BYTES as u128,
            actual,
        });
    }
    let mut len_field = [0; LEN_BYTES];
    file.read_exact(&mut len_field)?;
    let len = header_len(len_field, actual)?;
    let mut header =
        buffer::zeroed::<u8>(len, "safetensors header").map_err(FileError::AllocationFailed)?;
    file.read_exact(&mut header)?;
    parse(&header, actual, keep)
}

/// The header length the field gives, once it is within the cap and the
/// file holds that much.
fn header_len(field: [u8; LEN_BYTES], actual: u64) -> Result<usize, FileError> {
    let claimed = u64::from_le_bytes(field);
    if claimed > MAX_HEADER_BYTES {
        return Err(FileError::HeaderTooLong {
            claimed,
            max: MAX_HEADER_BYTES,
        });
    }
    let expected = LEN_BYTES as u128 + u128::from(claimed);
    if expected > u128::from(actual) {
        return Err(FileError::FileLength { expected, actual });
    }
    // At most MAX_HEADER_BYTES, which fits in any usize of 32 bits or more.
    usize::try_from(claimed).map_err(|_| FileError::HeaderTooLong {
        claimed,
        max: MAX_HEADER_BYTES,
    })
}

/// Parses `header` (the bytes after the length field of a file of `actual`
/// bytes) and checks it against the file.
fn parse(header: &[u8], actual: u64, keep: &Keep<'_>) -> Result<Header, FileError> {
    let text = std::str::from_utf8(header)
        .map_err(|error| FileError::Format(SafeTensorError::InvalidHeader(error)))?;
    let mut slot = None;
    let mut json = serde_json::Deserializer::from_str(text);
    let parsed = HeaderSeed {
        keep,
        slot: &mut slot,
    }
    .deserialize(&mut json)
    .and_then(|parsed| json.end().map(|()| parsed));
    let (mut tensors, metadata) = match parsed {
        Ok(parsed) => parsed,
        Err(error) => {
            return Err(slot.unwrap_or(FileError::Format(
                SafeTensorError::InvalidHeaderDeserialization(error),
            )));
        }
    };

    // Names are unique: a name listed twice is the first thing wrong with
    // a file, whatever its two ranges.
    tensors.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = tensors.windows(2).find(|pair| pair[0].name == pair[1].name) {
        return Err(FileError::DuplicateEntry {
            key: pair[0].name.clone(),
        });
    }

    // Each tensor's bits fit in its byte range. A range that runs
    // backwards is left to the tiling check, which names it.
    for entry in &tensors {
        let Some(bits) = entry.bits else {
            return Err(FileError::TensorTooLarge {
                name: entry.name.clone(),
                dtype: entry.dtype.to_string(),
            });
        };
        if let Some(bytes) = entry.end.checked_sub(entry.start)
            && (!bits.is_multiple_of(8) || bits / 8 != bytes)
        {
            return Err(FileError::TensorBytes {
                name: entry.name.clone(),
                bits,
                bytes,
            });
        }
    }

    // The byte ranges, in order, tile the data from 0 (as safetensors
    // requires; an empty tensor may sit anywhere its start fits).
    tensors.sort_unstable_by_key(|entry| (entry.start, entry.end));
    let mut data_len = 0usize;
    for entry in &tensors {
        if entry.start != data_len || entry.end < entry.start {
            return Err(FileError::DataOffsets {
                name: entry.name.clone(),
                start: entry.start,
                end: entry.end,
                expected_start: data_len,
            });
        }
        data_len = entry.end;
    }
    // Back in name order, for lookups.
    tensors.sort_unstable_by(|a, b| a.name.cmp(&b.name));

    let data_start = LEN_BYTES as u64 + header.len() as u64;
    let expected = u128::from(data_start) + data_len as u128;
    if expected != u128::from(actual) {
        return Err(FileError::FileLength { expected, actual });
    }
    Ok(Header {
        data_start,
        tensors,
        metadata,
    })
}

/// Stores `error` in `slot` and gives serde an error that stops the pass
/// (note 3).
fn fail<E: de::Error>(slot: &mut Option<FileError>, error: FileError) -> E {
    let message = error.to_string();
    *slot = Some(error);
    E::custom(message)
}

/// The header object: tensors and metadata.
struct HeaderSeed<'k, 's> {
    keep: &'k Keep<'k>,
    slot: &'s mut Option<FileError>,
}

impl<'de> DeserializeSeed<'de> for HeaderSeed<'_, '_> {
    type Value = (Vec<Entry>, Vec<(String, String)>);

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed<'_, '_> {
    type Value = (Vec<Entry>, Vec<(String, String)>);

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a safetensors header object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut tensors = Vec::new();
        let mut metadata = Vec::new();
        let mut seen_metadata = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == METADATA_KEY {
                if seen_metadata {
                    return Err(fail(self.slot, FileError::DuplicateEntry { key }));
                }
                seen_metadata = true;
                map.next_value_seed(MetadataSeed {
                    keep: self.keep,
                    slot: self.slot,
                    out: &mut metadata,
                })?;
            } else {
                let keep = self.keep.tensor(&key);
                let info = map.next_value_seed(InfoSeed { keep })?;
                tensors.push(Entry {
                    name: key,
                    dtype: info.dtype,
                    start: info.start,
                    end: info.end,
                    bits: info.bits,
                    shape: info.shape,
                });
            }
        }
        Ok((tensors, metadata))
    }
}

/// The `__metadata__` object (or `null`): string values, those under the
/// keys asked for kept.
struct MetadataSeed<'k, 's, 'o> {
    keep: &'k Keep<'k>,
    slot: &'s mut Option<FileError>,
    out: &'o mut Vec<(String, String)>,
}

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_, '_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed<'_, '_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a map of strings to strings, or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value::<String>()?;
            if self.keep.metadata(&key) {
                if self.out.iter().any(|(k, _)| *k == key) {
                    return Err(fail(self.slot, FileError::DuplicateEntry { key }));
                }
                self.out.push((key, value));
            }
        }
        Ok(())
    }
}

/// What the header says of one tensor.
struct Info {
    dtype: Dtype,
    start: usize,
    end: usize,
    bits: Option<usize>,
    shape: Option<Box<Shape>>,
}

/// One tensor's object: `dtype`, `shape` and `data_offsets` (other fields
/// are skipped, as safetensors skips them).
struct InfoSeed {
    keep: bool,
}

impl<'de> DeserializeSeed<'de> for InfoSeed {
    type Value = Info;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Info, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for InfoSeed {
    type Value = Info;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a tensor's dtype, shape and data_offsets")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Info, A::Error> {
        let mut dtype = None;
        let mut shape = None;
        let mut offsets = None;
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "dtype" if dtype.is_some() => return Err(de::Error::duplicate_field("dtype")),
                "dtype" => dtype = Some(map.next_value::<Dtype>()?),
                "shape" if shape.is_some() => return Err(de::Error::duplicate_field("shape")),
                "shape" => shape = Some(map.next_value_seed(ShapeSeed { keep: self.keep })?),
                "data_offsets" if offsets.is_some() => {
                    return Err(de::Error::duplicate_field("data_offsets"));
                }
                "data_offsets" => offsets = Some(map.next_value::<(usize, usize)>()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let dtype = dtype.ok_or_else(|| de::Error::missing_field("dtype"))?;
        let shape = shape.ok_or_else(|| de::Error::missing_field("shape"))?;
        let (start, end) = offsets.ok_or_else(|| de::Error::missing_field("data_offsets"))?;

        // The bits are checked against the byte range once the names are
        // known to be unique.
        let bits = shape
            .elements
            .and_then(|elements| elements.checked_mul(dtype.bitsize()));
        Ok(Info {
            dtype,
            start,
            end,
            bits,
            shape: shape.kept,
        })
    }
}

/// A shape as the pass sees it: its element count, and its dims if kept.
struct Counted {
    /// The product of the dims, `None` once it overflows (safetensors' rule:
    /// a zero after an overflow does not undo it).
    elements: Option<usize>,
    kept: Option<Box<Shape>>,
}

/// A shape: counted, and kept (up to [`MAX_DIMS`] dims) if `keep`.
struct ShapeSeed {
    keep: bool,
}

impl<'de> DeserializeSeed<'de> for ShapeSeed {
    type Value = Counted;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Counted, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ShapeSeed {
    type Value = Counted;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a shape: an array of sizes")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Counted, A::Error> {
        let mut elements = Some(1usize);
        let mut dims = Vec::new();
        let mut count = 0usize;
        while let Some(dim) = seq.next_element::<usize>()? {
            elements = elements.and_then(|e| e.checked_mul(dim));
            if self.keep && dims.len() < MAX_DIMS {
                dims.push(dim);
            }
            // Each dim takes a byte of the header at least: no overflow.
            count = count.saturating_add(1);
        }
        let kept = self.keep.then(|| {
            dims.shrink_to_fit();
            Box::new(Shape { dims, count })
        });
        Ok(Counted { elements, kept })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data_len: usize) -> Vec<u8> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + data_len, 0);
        bytes
    }

    #[test]
    fn only_the_tensor_asked_for_keeps_its_shape_and_only_its_metadata() {
        let ones = vec!["1"; 1000].join(",");
        let header = format!(
            r#"{{"__metadata__":{{"w.dim":"3","x.dim":"4"}},"long":{{"dtype":"U8","shape":[{ones}],"data_offsets":[0,1]}},"w":{{"dtype":"U8","shape":[2,3],"data_offsets":[1,7]}}}}"#
        );
        let bytes = file(&header, 7);
        let keys = ["w.dim".to_owned()];
        let parsed = from_bytes(
            &bytes,
            &Keep::One {
                name: "w",
                keys: &keys,
            },
        )
        .unwrap();
        assert_eq!(parsed.names(), ["long", "w"]);
        assert!(parsed.get("long").unwrap().shape.is_none());
        let w = parsed.get("w").unwrap().shape.as_deref().unwrap();
        assert_eq!((w.dims.as_slice(), w.count), (&[2, 3][..], 2));
        assert_eq!(parsed.metadata, [("w.dim".to_owned(), "3".to_owned())]);

        let all = from_bytes(&bytes, &Keep::All).unwrap();
        let long = all.get("long").unwrap().shape.as_deref().unwrap();
        assert_eq!((long.dims.len(), long.count), (MAX_DIMS, 1000));
        assert!(all.metadata.is_empty());
    }
}
