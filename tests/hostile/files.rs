//! Files that lie about themselves: absurd header lengths, byte counts past
//! `usize`, shapes of a hundred thousand dims, names listed twice, ranges
//! that do not tile the data. Each read returns its precise error, the same
//! from a path as from bytes, and every file the `safetensors` crate
//! accepts reads as it reads it.

use std::fs::{self, File};
use std::path::Path;

use embedding_kernels::formats::{Format, RowWise};
use embedding_kernels::io::{self, FileError, MAX_DIMS, MAX_HEADER_BYTES};
use embedding_kernels::quantized::{QuantizedEmbedding, QuantizedEmbeddingBag};
use embedding_kernels::{Embedding, Mode};

/// A file of `header` (unpadded) and `data`.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// A header entry for tensor `name`.
fn tensor(name: &str, dtype: &str, shape: &str, start: u128, end: u128) -> String {
    format!(r#""{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{start},{end}]}}"#)
}

/// `{a,b,...}`.
fn object(entries: &[String]) -> String {
    format!("{{{}}}", entries.join(","))
}

/// A shape of `n` ones.
fn ones(n: usize) -> String {
    format!("[{}]", vec!["1"; n].join(","))
}

/// Every reader of the bytes, asked for `name`: the `f32` table, the table
/// of any format, the packed table, every table.
fn read_bytes(bytes: &[u8], name: &str) -> [Result<String, String>; 4] {
    [
        show(io::from_bytes(bytes, name).map(|t| (t.num_embeddings, t.embedding_dim))),
        show(io::table_from_bytes(bytes, name).map(|t| (t.rows(), t.dim()))),
        show(io::packed_from_bytes(bytes, name, RowWise::Int8, 1).map(|t| (t.rows(), t.dim()))),
        show(io::all_from_bytes(bytes).map(|ts| (ts.len(), 0))),
    ]
}

/// The same readers, from a file at `path`.
fn read_path(path: &Path, name: &str) -> [Result<String, String>; 4] {
    [
        show(io::load(path, name).map(|t| (t.num_embeddings, t.embedding_dim))),
        show(io::load_table(path, name).map(|t| (t.rows(), t.dim()))),
        show(io::load_packed(path, name, RowWise::Int8, 1).map(|t| (t.rows(), t.dim()))),
        show(io::load_all(path).map(|ts| (ts.len(), 0))),
    ]
}

fn show(result: Result<(usize, usize), FileError>) -> Result<String, String> {
    result
        .map(|shape| format!("{shape:?}"))
        .map_err(|e| e.to_string())
}

/// Writes `bytes` to a file and checks that every reader gives from it
/// what it gives from the bytes; returns the readers' results.
fn same_from_path(bytes: &[u8], name: &str) -> [Result<String, String>; 4] {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.safetensors");
    fs::write(&path, bytes).unwrap();
    let from_bytes = read_bytes(bytes, name);
    assert_eq!(read_path(&path, name), from_bytes, "{name}");
    from_bytes
}

#[test]
fn absurd_header_lengths_are_refused_with_the_length_claimed() {
    for claimed in [u64::MAX, 1 << 40, MAX_HEADER_BYTES + 1] {
        let mut bytes = claimed.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        let want = format!(
            "the file claims a header of {claimed} bytes; at most {MAX_HEADER_BYTES} are read"
        );
        for result in same_from_path(&bytes, "w") {
            assert_eq!(result, Err(want.clone()));
        }
        assert!(matches!(
            io::from_bytes(&bytes, "w"),
            Err(FileError::HeaderTooLong { claimed: c, max: MAX_HEADER_BYTES }) if c == claimed
        ));
    }
    // At the cap, the length is believed only as far as the file holds it.
    let mut bytes = MAX_HEADER_BYTES.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    assert!(matches!(
        io::from_bytes(&bytes, "w"),
        Err(FileError::FileLength { expected, actual: 10 }) if expected == 8 + MAX_HEADER_BYTES as u128
    ));
}

#[test]
fn a_large_file_with_a_bad_header_is_refused_without_reading_it() {
    // A sparse file of 1 GiB: its 8-byte length and small header are all
    // that is read before the error (a whole-file read would take 1 GiB).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.safetensors");
    let gib = 1u64 << 30;
    let header = object(&[tensor("w", "F32", "[1,1]", 0, 4)]);
    fs::write(&path, file(&header, &[])).unwrap();
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(gib)
        .unwrap();
    let expected = 8 + header.len() as u128 + 4;
    for err in [
        io::load(&path, "w").unwrap_err(),
        io::load_table(&path, "w").unwrap_err(),
        io::load_all(&path).unwrap_err(),
    ] {
        assert!(
            matches!(err, FileError::FileLength { expected: e, actual } if e == expected && actual == gib),
            "{err:?}"
        );
    }
}

#[test]
fn byte_counts_past_usize_are_errors_not_panics() {
    // The largest byte tensor: 2^61 - 1 bytes (2^61 of them are 2^64 bits).
    let big = (1u128 << 61) - 1;
    // Eight of them: the data ends 8 bytes short of 2^64, so 8 + header +
    // data passes u64 (safetensors' own check adds these in usize).
    let entries: Vec<String> = (0..8u128)
        .map(|k| {
            tensor(
                &format!("t{k}"),
                "U8",
                &format!("[{big}]"),
                k * big,
                (k + 1) * big,
            )
        })
        .collect();
    let end = 8 * big;
    let header = object(&entries);
    let bytes = file(&header, &[0; 16]);
    let want = FileError::FileLength {
        expected: 8 + header.len() as u128 + end,
        actual: bytes.len() as u64,
    }
    .to_string();
    for result in same_from_path(&bytes, "t0") {
        assert_eq!(result, Err(want.clone()));
    }

    // One such tensor, which the file does not hold.
    let header = object(&[tensor("w", "U8", &format!("[{big}]"), 0, big)]);
    let bytes = file(&header, &[]);
    assert!(matches!(
        io::table_from_bytes(&bytes, "w"),
        Err(FileError::FileLength { expected, .. }) if expected == 8 + header.len() as u128 + big
    ));
    let header = object(&[tensor("w", "U8", &format!("[{}]", big + 1), 0, big + 1)]);
    assert!(matches!(
        io::table_from_bytes(&file(&header, &[]), "w"),
        Err(FileError::TensorTooLarge { .. })
    ));

    // Bits past usize: 2^62 F32 values, and a count that overflows.
    for shape in [
        format!("[{}]", 1u128 << 62),
        "[4294967296,4294967296,2]".into(),
    ] {
        let header = object(&[tensor("w", "F32", &shape, 0, 0)]);
        for result in same_from_path(&file(&header, &[]), "w") {
            assert_eq!(
                result,
                Err(
                    "tensor `w`: its shape holds more F32 values than a usize counts in bits"
                        .into()
                ),
                "{shape}"
            );
        }
    }
    // A zero after the overflow does not undo it (as in safetensors).
    let header = object(&[tensor("w", "U8", "[4294967296,4294967296,0]", 0, 0)]);
    assert!(matches!(
        io::from_bytes(&file(&header, &[]), "w"),
        Err(FileError::TensorTooLarge { .. })
    ));
}

#[test]
fn a_shape_of_many_dims_is_counted_not_kept() {
    let data: Vec<u8> = (0..28).collect();
    // 100 000 dims of 1 on another tensor: the file is valid and the table
    // beside it reads.
    let header = object(&[
        tensor("junk", "F32", &ones(100_000), 0, 4),
        tensor("w", "F32", "[2,3]", 4, 28),
    ]);
    let bytes = file(&header, &data);
    let table = io::from_bytes(&bytes, "w").unwrap();
    assert_eq!((table.num_embeddings, table.embedding_dim), (2, 3));
    assert_eq!(table.weight[0].to_bits(), u32::from_le_bytes([4, 5, 6, 7]));
    let theirs = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(theirs.tensor("w").unwrap().data(), &data[4..]);

    // Asked for, it is refused with its dims counted.
    let [f32s, any, packed, all] = same_from_path(&bytes, "junk");
    let too_many = Err(format!(
        "tensor `junk` has 100000 dims; a tensor read may have at most {MAX_DIMS}"
    ));
    assert_eq!(f32s, too_many);
    assert_eq!(any, too_many);
    assert_eq!(all, too_many);
    assert_eq!(
        packed,
        Err("tensor `junk` has dtype F32, expected U8".into())
    );

    // MAX_DIMS dims are kept whole; one more is too many.
    let header = object(&[tensor("w", "F32", &ones(MAX_DIMS), 0, 4)]);
    let err = io::from_bytes(&file(&header, &data[..4]), "w").unwrap_err();
    assert!(
        matches!(&err, FileError::WrongShape { shape, .. } if *shape == vec![1; MAX_DIMS]),
        "{err:?}"
    );
    let header = object(&[tensor("w", "F32", &ones(MAX_DIMS + 1), 0, 4)]);
    let err = io::from_bytes(&file(&header, &data[..4]), "w").unwrap_err();
    assert!(
        matches!(err, FileError::TooManyDims { dims, max: MAX_DIMS, .. } if dims == MAX_DIMS + 1),
        "{err:?}"
    );
}

#[test]
fn names_listed_twice_are_refused() {
    let data = [0u8; 8];
    let twice = object(&[
        tensor("w", "F32", "[1,1]", 0, 4),
        tensor("w", "F32", "[1,1]", 4, 8),
    ]);
    for result in same_from_path(&file(&twice, &data), "w") {
        assert_eq!(result, Err("the header lists `w` twice".into()));
    }
    // Listed twice over one range, or with a size that the range does not
    // hold: the name is what is wrong first (safetensors keeps the last).
    for second in [
        tensor("w", "F32", "[1,1]", 0, 4),
        tensor("w", "F16", "[1,1]", 0, 4),
    ] {
        let header = object(&[tensor("w", "F32", "[1,1]", 0, 4), second]);
        assert!(matches!(
            io::from_bytes(&file(&header, &data[..4]), "w"),
            Err(FileError::DuplicateEntry { key }) if key == "w"
        ));
    }
    let metadata_twice = format!(
        r#"{{"__metadata__":{{}},"__metadata__":{{}},{}}}"#,
        tensor("w", "F32", "[1,1]", 0, 4)
    );
    assert!(matches!(
        io::from_bytes(&file(&metadata_twice, &data[..4]), "w"),
        Err(FileError::DuplicateEntry { key }) if key == "__metadata__"
    ));
    // A metadata key that is read, twice: refused by the reader that reads
    // it, ignored by the others.
    let format_twice = format!(
        r#"{{"__metadata__":{{"w.format":"int8","w.dim":"1","w.format":"int4"}},{}}}"#,
        tensor("w", "U8", "[1,9]", 0, 9)
    );
    let bytes = file(&format_twice, &[0; 9]);
    assert!(matches!(
        io::table_from_bytes(&bytes, "w"),
        Err(FileError::DuplicateEntry { key }) if key == "w.format"
    ));
    let table = io::packed_from_bytes(&bytes, "w", RowWise::Int8, 1).unwrap();
    assert_eq!((table.format(), table.rows()), (Format::Int8, 1));
}

#[test]
fn ranges_that_do_not_tile_the_data_are_refused_by_name() {
    let data = [0u8; 12];
    let cases = [
        // A gap before the second tensor.
        (
            vec![
                tensor("a", "F32", "[1,1]", 0, 4),
                tensor("b", "F32", "[1,1]", 8, 12),
            ],
            "tensor `b` spans bytes 8..12 of the data, where bytes from 4 on come next",
        ),
        // Two tensors over the same bytes.
        (
            vec![
                tensor("a", "F32", "[1,1]", 0, 4),
                tensor("b", "F32", "[1,1]", 0, 4),
            ],
            "tensor `b` spans bytes 0..4 of the data, where bytes from 4 on come next",
        ),
        // A range that runs backwards.
        (
            vec![tensor("a", "F32", "[0,1]", 4, 0)],
            "tensor `a` spans bytes 4..0 of the data, where bytes from 0 on come next",
        ),
    ];
    for (entries, want) in cases {
        let bytes = file(&object(&entries), &data);
        for result in same_from_path(&bytes, "a") {
            assert_eq!(result, Err(want.into()));
        }
    }
}

#[test]
fn ranges_that_do_not_hold_the_shape_are_refused() {
    // Three F4 values are 12 bits, not whole bytes.
    let header = object(&[tensor("w", "F4", "[3]", 0, 1)]);
    let err = io::from_bytes(&file(&header, &[0]), "w").unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor `w` takes 12 bits by its dtype and shape, but its byte range holds 1 bytes"
    );
    let header = object(&[tensor("w", "F32", "[2,2]", 0, 12)]);
    assert!(matches!(
        io::from_bytes(&file(&header, &[0; 12]), "w"),
        Err(FileError::TensorBytes {
            bits: 128,
            bytes: 12,
            ..
        })
    ));
}

#[test]
fn files_safetensors_accepts_read_the_same() {
    let data: Vec<u8> = (0..24).collect();
    let w = tensor("w", "F32", "[2,3]", 0, 24);
    let headers = [
        // A null metadata, as safetensors allows.
        format!(r#"{{"__metadata__":null,{w}}}"#),
        // Fields it does not know, skipped as it skips them.
        r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24],"extra":[{"a":[1,2]}]}}"#.into(),
        // Empty tensors anywhere their start fits, and whitespace after.
        format!(
            "{{{},{w},{}}}   ",
            tensor("e", "F64", "[0,7]", 0, 0),
            tensor("z", "I64", "[5,0]", 24, 24)
        ),
    ];
    for header in headers {
        let bytes = file(&header, &data);
        let theirs = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let ours = io::from_bytes(&bytes, "w").unwrap();
        let their_w = theirs.tensor("w").unwrap();
        assert_eq!(their_w.shape(), [ours.num_embeddings, ours.embedding_dim]);
        assert_eq!(
            bytemuck::cast_slice::<f32, u8>(&ours.weight),
            their_w.data()
        );
        let [f32s, ..] = same_from_path(&bytes, "w");
        assert_eq!(f32s, Ok("(2, 3)".into()));
    }
}

#[test]
fn layers_loading_a_hostile_file_return_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("layer.safetensors");
    let mut bytes = u64::MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    fs::write(&path, &bytes).unwrap();
    let want = FileError::HeaderTooLong {
        claimed: u64::MAX,
        max: MAX_HEADER_BYTES,
    }
    .to_string();
    assert_eq!(
        Embedding::load(&path, "w", false).unwrap_err().to_string(),
        want
    );
    assert_eq!(
        QuantizedEmbedding::load(&path, "w")
            .unwrap_err()
            .to_string(),
        want
    );
    assert_eq!(
        QuantizedEmbeddingBag::load(&path, "w", Mode::Sum, None, false)
            .unwrap_err()
            .to_string(),
        want
    );
}

#[test]
fn a_path_that_is_not_a_regular_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = io::load(dir.path(), "w").unwrap_err();
    assert!(
        matches!(err, FileError::Io(_) | FileError::FileLength { .. }),
        "{err:?}"
    );
}
