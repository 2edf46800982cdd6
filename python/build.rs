//! Records the optimisation level the extension is built at, so that a
//! timing script can tell an unoptimised build (CI's, or `maturin develop`'s)
//! from the optimised one `pip install` makes.

fn main() {
    // Cargo gives build scripts the profile's level: "0" to "3", "s" or "z".
    let level = std::env::var("OPT_LEVEL").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=EMBEDDING_KERNELS_OPT_LEVEL={level}");
}
