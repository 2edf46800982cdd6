//! A next-word model trained with the crate's fused sparse SGD.
//!
//! ```text
//! cargo run --release --example train
//! cargo run --release --example train -- --epochs 400 --dim 32 --lr 0.5 --seed 3
//! cargo run --release --example train -- --help
//! ```
//!
//! The model is a bigram language model: it sees one word and predicts the
//! next one.
//!
//! ```text
//! x      = E[id]                  Embedding, [batch, dim]         (the crate)
//! logits = x · W + b              linear layer, [batch, vocab]    (plain loops below)
//! loss   = mean cross-entropy(softmax(logits), next id)
//! ```
//!
//! The linear layer is dense: every step updates all of `W`. The embedding is
//! sparse: a batch touches a few rows of `E`, and `Embedding::sparse_step`
//! sums each touched row's gradient and applies SGD to it in one pass,
//! without building a `vocab × dim` gradient (PyTorch's
//! `nn.Embedding(sparse=True)` with `optim.SGD`, fused). Its small weight
//! decay (`Sgd::with_weight_decay`) also touches only those rows.
//!
//! A word's row ends up encoding what tends to follow it, so words used the
//! same way ("cat" and "dog" before "drinks") get similar rows; the run ends
//! by printing nearest neighbours by cosine similarity.

use std::collections::HashMap;
use std::time::Instant;

use clap::Parser;
use clap::builder::RangedU64ValueParser;
use embedding_kernels::vocab::SPECIAL_TOKENS;
use embedding_kernels::{Embedding, EmbeddingError, EmbeddingOptions, Sgd, Vocab};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The training text, one sentence a line, written for this example: a few
/// topics with repeated patterns, so that words of a topic share neighbours.
const CORPUS: &str = "
the cat drinks milk
the dog drinks water
the cow drinks water
the horse drinks water
the cat eats fish
the dog eats meat
the cow eats grass
the horse eats grass
the bird eats seeds
the cat drinks water
the bird drinks water
the dog eats bread
the bird eats bread
the cat sleeps on the bed
the dog sleeps on the floor
the bird sleeps in the tree
the cow sleeps in the field
the dog runs in the park
the horse runs in the field
the cat chases the bird
the dog chases the cat
the bird sings in the tree
we eat bread for breakfast
we eat eggs for breakfast
we eat cheese for lunch
we eat soup for lunch
we eat rice for dinner
we eat fish for dinner
we eat meat for dinner
we drink milk for breakfast
we drink tea for breakfast
we drink coffee in the morning
we drink juice with lunch
we drink water with dinner
bread and cheese are food
rice and soup are food
tea and coffee are drinks
milk and juice are drinks
red and blue are colours
green and yellow are colours
the sky is blue
the grass is green
the sun is yellow
the apple is red
the car is red
the ball is blue
the leaf is green
the banana is yellow
she has a red hat
she has a blue hat
he has a green ball
he has a yellow ball
i like the red car
i like the blue car
it is sunny today
it is rainy today
it is cold today
it is warm today
it was windy yesterday
it was cloudy yesterday
it was sunny yesterday
it will rain tomorrow
it will snow tomorrow
in winter it is cold
in summer it is warm
in winter it snows
in summer it is sunny
in spring it rains
in autumn it is windy
";

/// Words whose nearest neighbours are printed at the end.
const PROBES: [&str; 8] = [
    "cat", "horse", "milk", "bread", "red", "sunny", "winter", "eats",
];

/// Command-line flags; the defaults train in about a second.
#[derive(Parser, Debug)]
#[command(about = "Train a bigram next-word model with Embedding::sparse_step")]
struct Args {
    /// Passes over the (current word, next word) pairs.
    #[arg(long, default_value_t = 200, value_parser = at_least_one())]
    epochs: usize,
    /// Embedding width.
    #[arg(long, default_value_t = 24, value_parser = at_least_one())]
    dim: usize,
    /// SGD learning rate, for the embedding and the linear layer alike.
    #[arg(long, default_value_t = 1.0)]
    lr: f32,
    /// L2 penalty on the embedding rows a batch touches.
    ///
    /// The crate applies it to touched rows only. It wears down the random
    /// part of the N(0, 1) start, which otherwise dominates the rows of rare
    /// words.
    #[arg(long, default_value_t = 0.003)]
    weight_decay: f32,
    /// Pairs per mini-batch.
    #[arg(long, default_value_t = 16, value_parser = at_least_one())]
    batch: usize,
    /// Seed of the initial weights and of the shuffling.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

/// A flag that must be a whole number, 1 or more.
fn at_least_one() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..)
}

/// The output layer, `logits = x · W + b`, with `W` stored `[dim, vocab]`
/// row-major.
struct Linear {
    w: Vec<f32>,
    b: Vec<f32>,
    dim: usize,
    vocab: usize,
}

impl Linear {
    /// `W` and `b` uniform in ±1/sqrt(dim), as PyTorch's `nn.Linear`.
    fn new(dim: usize, vocab: usize, rng: &mut ChaCha8Rng) -> Linear {
        let k = 1.0 / (dim as f32).sqrt();
        let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-k..k)).collect();
        Linear {
            w: draw(dim * vocab),
            b: draw(vocab),
            dim,
            vocab,
        }
    }

    /// `logits[i, :] = b + Σ_k x[i, k] · W[k, :]` for each of the `x.len() /
    /// dim` rows of `x`.
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut logits = Vec::with_capacity(x.len() / self.dim * self.vocab);
        for xi in x.chunks(self.dim) {
            let start = logits.len();
            logits.extend_from_slice(&self.b);
            let out = &mut logits[start..];
            for (&xik, wk) in xi.iter().zip(self.w.chunks(self.vocab)) {
                for (o, &wkj) in out.iter_mut().zip(wk) {
                    *o += xik * wkj;
                }
            }
        }
        logits
    }

    /// Given `x` and `dlogits = ∂loss/∂logits`, returns `∂loss/∂x =
    /// dlogits · Wᵀ` and then takes an SGD step on `W` and `b`:
    /// `∂loss/∂W = xᵀ · dlogits`, `∂loss/∂b = Σ_i dlogits[i, :]`.
    fn backward_and_step(&mut self, x: &[f32], dlogits: &[f32], lr: f32) -> Vec<f32> {
        let mut dx = vec![0.0; x.len()];
        // dx[i, k] = Σ_j dlogits[i, j] · W[k, j], with W as it was in forward.
        for (dxi, di) in dx.chunks_mut(self.dim).zip(dlogits.chunks(self.vocab)) {
            for (dxik, wk) in dxi.iter_mut().zip(self.w.chunks(self.vocab)) {
                *dxik = di.iter().zip(wk).map(|(d, w)| d * w).sum();
            }
        }
        // W[k, j] -= lr · Σ_i x[i, k] · dlogits[i, j]; b[j] -= lr · Σ_i dlogits[i, j].
        for (xi, di) in x.chunks(self.dim).zip(dlogits.chunks(self.vocab)) {
            for (&xik, wk) in xi.iter().zip(self.w.chunks_mut(self.vocab)) {
                for (w, &d) in wk.iter_mut().zip(di) {
                    *w -= lr * xik * d;
                }
            }
            for (b, &d) in self.b.iter_mut().zip(di) {
                *b -= lr * d;
            }
        }
        dx
    }
}

/// Turns `logits` (`[batch, vocab]`) in place into `∂loss/∂logits` for the
/// mean cross-entropy against `targets`, and returns the summed loss.
///
/// For one row with logits `z`, `p = softmax(z)`, `p_j = exp(z_j) / Σ_k
/// exp(z_k)`, and target `y`, the loss is `L = -log p_y = -z_y + log Σ_k
/// exp(z_k)`. Its derivative is
///
/// ```text
/// ∂L/∂z_j = -[j = y] + exp(z_j) / Σ_k exp(z_k) = p_j - [j = y]
/// ```
///
/// (the predicted distribution minus the one-hot target). The batch loss is
/// the mean over `batch` rows, so each row's gradient is divided by `batch`.
/// Subtracting `max z` first changes neither `p` nor `L` but keeps `exp`
/// from overflowing.
fn softmax_cross_entropy(logits: &mut [f32], targets: &[u32], vocab: usize) -> f64 {
    let batch = targets.len() as f32;
    let mut loss = 0.0f64;
    for (z, &y) in logits.chunks_mut(vocab).zip(targets) {
        let y = y as usize;
        let max = z.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let z_y = z[y] - max;
        let mut sum = 0.0f32;
        for v in z.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        // -log p_y = log Σ exp(z_k - max) - (z_y - max): no log of a tiny p_y.
        loss += f64::from(sum.ln() - z_y);
        for v in z.iter_mut() {
            *v /= sum * batch; // p_j / batch
        }
        z[y] -= 1.0 / batch; // (p_y - 1) / batch
    }
    loss
}

fn main() {
    if let Err(err) = run(&Args::parse()) {
        eprintln!("error: {err}");
        std::process::exit(1);
    }
}

/// The whole run; an error (a bad `--lr`, say) ends it with a message.
fn run(args: &Args) -> Result<(), EmbeddingError> {
    let start = Instant::now();

    // 1. Data: the vocabulary, then one (current, next) pair per adjacent
    //    pair of ids in each sentence wrapped in <sos> … <eos>, so the model
    //    also learns how sentences start and end.
    let vocab = Vocab::from_text(CORPUS);
    let sentences: Vec<&str> = CORPUS.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    for sentence in &sentences {
        let ids = vocab.encode_with_specials(sentence);
        pairs.extend(ids.windows(2).map(|w| (w[0], w[1])));
    }
    println!(
        "corpus: {} sentences, {} tokens in the vocabulary, {} training pairs",
        sentences.len(),
        vocab.len(),
        pairs.len()
    );

    // 2. The model. One seed drives everything: the embedding's N(0, 1)
    //    table, the linear layer and the shuffling.
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let options = EmbeddingOptions {
        seed: Some(args.seed),
        ..EmbeddingOptions::default()
    };
    let mut emb = Embedding::with_options(vocab.len(), args.dim, options)?;
    let mut linear = Linear::new(args.dim, vocab.len(), &mut rng);
    let mut sgd = Sgd::new(args.lr).with_weight_decay(args.weight_decay);
    println!(
        "model: Embedding({v}, {d}) -> Linear({d}, {v}); SGD lr {}, embedding weight decay {}, \
         batch {}, {} epochs\n",
        args.lr,
        args.weight_decay,
        args.batch,
        args.epochs,
        v = vocab.len(),
        d = args.dim,
    );

    // 3. Training.
    let report_every = (args.epochs / 10).max(1);
    let (mut first, mut last) = (f64::NAN, f64::NAN);
    let (mut cur, mut next) = (Vec::new(), Vec::new());
    for epoch in 1..=args.epochs {
        pairs.shuffle(&mut rng);
        let mut total = 0.0f64;
        for chunk in pairs.chunks(args.batch) {
            cur.clear();
            next.clear();
            cur.extend(chunk.iter().map(|p| p.0));
            next.extend(chunk.iter().map(|p| p.1));

            // Forward: look up the current words, [n, dim], then the logits.
            let x = emb.forward(&cur, &[cur.len()])?.values;
            let mut logits = linear.forward(&x);
            // Loss, and logits turned into ∂loss/∂logits.
            total += softmax_cross_entropy(&mut logits, &next, vocab.len());
            // Backward through the linear layer (which updates itself) ...
            let dx = linear.backward_and_step(&x, &logits, args.lr);
            // ... and into the embedding: for every distinct id in `cur`,
            // row -= lr · (sum of its rows of dx), in one fused pass.
            emb.sparse_step(&dx, &cur, &mut sgd)?;
        }
        let mean = total / pairs.len() as f64;
        if epoch == 1 {
            first = mean;
        }
        last = mean;
        if epoch == 1 || epoch % report_every == 0 || epoch == args.epochs {
            println!("epoch {epoch:>4}  mean loss {mean:.4}");
        }
    }
    println!(
        "\nloss: first epoch {first:.4}, last epoch {last:.4} ({:.0} % of the first)",
        100.0 * last / first
    );
    println!(
        "      uniform guessing: ln({}) = {:.4}; the best any bigram model can do here: {:.4}",
        vocab.len(),
        (vocab.len() as f64).ln(),
        bigram_entropy(&pairs)
    );
    assert!(
        last < 0.7 * first,
        "training did not reduce the loss enough: first {first:.4}, last {last:.4}"
    );

    // 4. What the rows learned: nearest neighbours by cosine similarity,
    //    among the ordinary words (not the specials, not the word itself).
    println!("\nnearest neighbours (cosine similarity of embedding rows):");
    let weight = emb.weight();
    let row = |id: usize| &weight[id * args.dim..(id + 1) * args.dim];
    for word in PROBES {
        let Some(id) = vocab.id(word) else { continue };
        let id = id as usize;
        let mut scored: Vec<(f32, usize)> = (SPECIAL_TOKENS.len()..vocab.len())
            .filter(|&other| other != id)
            .map(|other| (cosine(row(id), row(other)), other))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let top: Vec<String> = scored
            .iter()
            .take(3)
            .map(|&(s, other)| format!("{} {s:.2}", vocab.token(other as u32).unwrap_or("?")))
            .collect();
        println!("  {word:>7}: {}", top.join(", "));
    }
    println!("\ndone in {:.2} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// The cross-entropy of the best bigram model, the one that predicts each
/// pair's next word with its frequency after the current word:
/// `-(1/N) Σ_pairs log(count(cur, next) / count(cur))`. No model that sees
/// only the current word can get a lower mean loss on these pairs.
fn bigram_entropy(pairs: &[(u32, u32)]) -> f64 {
    let mut pair_counts: HashMap<(u32, u32), f64> = HashMap::new();
    let mut word_counts: HashMap<u32, f64> = HashMap::new();
    for &(cur, next) in pairs {
        *pair_counts.entry((cur, next)).or_default() += 1.0;
        *word_counts.entry(cur).or_default() += 1.0;
    }
    let total: f64 = pair_counts
        .iter()
        .map(|(&(cur, _), &n)| -n * (n / word_counts[&cur]).ln())
        .sum();
    total / pairs.len() as f64
}

/// `a · b / (|a| |b|)`, summed in `f64`; 0 for a zero vector.
fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        dot += x * y;
        aa += x * x;
        bb += y * y;
    }
    let norm = (aa * bb).sqrt();
    if norm == 0.0 {
        0.0
    } else {
        (dot / norm) as f32
    }
}
