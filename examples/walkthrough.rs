//! A guided tour of the crate for PyTorch users: text → ids → vectors.
//!
//! ```text
//! cargo run --release --example walkthrough
//! ```
//!
//! Each step prints what it did, with the PyTorch line it stands for. The
//! tour checks its own claims (`assert!`), so a broken crate makes it exit
//! with an error instead of printing something wrong.

use embedding_kernels::embed_positions;
use embedding_kernels::positions::sinusoidal_positions;
use embedding_kernels::reference::{matmul, one_hot};
use embedding_kernels::vocab::{PAD, PAD_TOKEN};
use embedding_kernels::{Embedding, EmbeddingError, EmbeddingOptions, Vocab};

/// The row width: small, so each vector fits on one line.
const DIM: usize = 4;

fn main() -> Result<(), EmbeddingError> {
    // 1. A vocabulary. `Vocab` splits on whitespace and numbers the words:
    //    <pad> <unk> <sos> <eos> take ids 0..=3, then the words follow,
    //    most frequent first (ties: first seen first).
    let text = "the cat sat on the mat\n\
                the cat in the hat came back\n\
                a hat is on the cat\n\
                the dog sat in the sun";
    let vocab = Vocab::from_text(text);
    println!("1. Vocab of {} tokens (4 specials first):", vocab.len());
    let listed: Vec<String> = (0u32..)
        .zip(&vocab)
        .map(|(i, t)| format!("{i}:{t}"))
        .collect();
    println!("   {}\n", listed.join(" "));

    // 2. Sentence → ids, the `u32`s the layer takes (i32, i64, u64 and
    //    usize work as well).
    let sentence = "the cat in the hat";
    let ids = vocab.encode(sentence);
    println!("2. {sentence:?} → ids {ids:?}\n");

    // 3. The layer. PyTorch: `torch.manual_seed(42); emb = nn.Embedding(V, 4)`.
    //    The weights are N(0, 1), as in PyTorch; the seed makes them the
    //    same bits on every run (not PyTorch's bits: another generator).
    let seeded = EmbeddingOptions {
        seed: Some(42),
        ..EmbeddingOptions::default()
    };
    let mut emb = Embedding::with_options(vocab.len(), DIM, seeded)?;
    // PyTorch: `out = emb(torch.tensor(ids))`, shape [5, 4].
    let out = emb.forward(&ids, &[ids.len()])?;
    println!("3. emb(ids): shape {:?}, one row per token", out.shape);
    for (&id, row) in ids.iter().zip(out.values.chunks(DIM)) {
        println!(
            "   {:>5} (id {id:>2}) {}",
            vocab.token(id).unwrap_or("?"),
            fmt_row(row)
        );
    }
    println!("   (\"the\" appears twice and gets the same row twice)\n");

    // 4. What a lookup *is*: a one-hot matrix times the table. The crate's
    //    `reference` module computes exactly that (slowly) as the oracle
    //    every kernel is tested against.
    let hot = one_hot(&ids, vocab.len())?; // [5, V], one 1 per row
    let product = matmul(&hot, emb.weight(), ids.len(), vocab.len(), DIM)?; // [5, V]·[V, 4]
    println!("4. one_hot(ids) · weight, one-hot rows shown as digits:");
    for (hot_row, row) in hot.chunks(vocab.len()).zip(product.chunks(DIM)) {
        let digits: String = hot_row
            .iter()
            .map(|&h| if h == 1.0 { '1' } else { '0' })
            .collect();
        println!("   {digits} · W = {}", fmt_row(row));
    }
    let same_bits = product
        .iter()
        .zip(&out.values)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    println!("   equal bit for bit: {same_bits}\n");
    assert!(same_bits, "the lookup differs from the one-hot product");

    // 5. A bad id is an error, not a panic or a read past the table. Every id
    //    is checked before anything is written, so the output buffer (filled
    //    with NaN canaries here) keeps what it held.
    println!("5. Out-of-range ids (the table has {} rows):", vocab.len());
    let the = i64::from(ids[0]);
    for bad in [vocab.len() as i64, -1] {
        let bad_ids = [the, bad]; // i64, as PyTorch hands ids out
        let mut buffer = vec![f32::NAN; bad_ids.len() * DIM];
        let err = emb.forward_into(&bad_ids, &mut buffer).unwrap_err();
        let untouched = buffer.iter().all(|x| x.is_nan());
        println!("   ids {bad_ids:?}: error: {err}");
        println!("   output buffer still all NaN: {untouched}");
        assert!(untouched, "a failed call wrote to its output");
    }
    println!();

    // 6. A batch: sentences padded with <pad> (id 0) to one length, ids laid
    //    out row-major as [batch, seq]. PyTorch:
    //    `emb = nn.Embedding(V, 4, padding_idx=0); emb(ids)` with ids [2, L].
    let sentences = ["the cat in the hat", "the dog sat"];
    let seq = sentences
        .iter()
        .map(|s| s.split_whitespace().count())
        .max()
        .unwrap_or(0);
    let mut batch: Vec<u32> = Vec::with_capacity(sentences.len() * seq);
    for s in sentences {
        let mut row = vocab.encode(s);
        row.resize(seq, PAD); // pad on the right
        batch.extend(row);
    }
    let padded = EmbeddingOptions {
        padding_idx: Some(i64::from(PAD)), // row 0 starts at zero, never trained
        seed: Some(42),
        ..EmbeddingOptions::default()
    };
    let mut padded_emb = Embedding::with_options(vocab.len(), DIM, padded)?;
    let out = padded_emb.forward(&batch, &[sentences.len(), seq])?;
    println!(
        "6. Batch: input shape [{}, {seq}] → output shape {:?}",
        sentences.len(),
        out.shape
    );
    for (b, ids) in batch.chunks(seq).enumerate() {
        println!("   sentence {b}: {}  ids {ids:?}", vocab.decode(ids));
    }
    // Position t of sentence b is output row b·seq + t.
    let mut pad_rows = Vec::new();
    for (i, (&id, row)) in batch.iter().zip(out.values.chunks(DIM)).enumerate() {
        if id == PAD {
            assert!(row.iter().all(|&x| x == 0.0), "a padding row is not zero");
            pad_rows.push(format!("[{}, {}]", i / seq, i % seq));
        }
    }
    println!(
        "   {PAD_TOKEN} rows at {} are zeros: true\n",
        pad_rows.join(", ")
    );

    // 7. A transformer's input: token vectors plus sinusoidal positions
    //    (Vaswani et al., 2017), fused into one pass. `None`: no sqrt(dim)
    //    scaling of the token rows.
    let positions = sinusoidal_positions(seq, DIM)?; // [max_len = seq, 4]
    let mut x = vec![0.0; batch.len() * DIM];
    embed_positions(
        padded_emb.weight(),
        &positions,
        DIM,
        &batch,
        seq,
        None,
        &mut x,
    )?;
    println!(
        "7. Positions: table [{seq}, {DIM}] + tokens {:?} → [{}, {seq}, {DIM}]",
        out.shape,
        sentences.len()
    );
    println!("   position 0 row is {}", fmt_row(&positions[..DIM]));
    println!("   \"the\" at [0, 0] becomes {}", fmt_row(&x[..DIM]));
    Ok(())
}

/// A row as `[+0.123, -1.234, …]`.
fn fmt_row(row: &[f32]) -> String {
    let values: Vec<String> = row.iter().map(|x| format!("{x:+.3}")).collect();
    format!("[{}]", values.join(", "))
}
