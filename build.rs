//! Tells the crate whether it is compiled unoptimised (`cfg(unoptimised)`).
//!
//! The bag kernels inline their block bodies into the function that enables
//! the lanes' instructions. Unoptimised, every inlined local keeps a stack
//! slot of its own, and the AVX-512 bag sum's frame reached 7 MB: a call on
//! a thread's 2 MiB stack, or on Python's main thread, overflowed it. So an
//! unoptimised build keeps those bodies out of line, whatever its
//! debug-assertions setting; an optimised build always inlines them.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(unoptimised)");
    println!("cargo::rerun-if-changed=build.rs");
    // Cargo gives build scripts the profile's level: "0" to "3", "s" or "z".
    if std::env::var("OPT_LEVEL").is_ok_and(|level| level == "0") {
        println!("cargo::rustc-cfg=unoptimised");
    }
}
