//! The report's command line, as its outputs quote it: the arguments as
//! they would be typed through cargo, after the crate's environment
//! variables that change what the kernels do.

/// The crate's environment variable that changes what the kernels do, and
/// the values it takes: `EMBEDDING_KERNELS_ISA` caps the instruction set
/// the kernels run with, so that one build measures the levels against
/// each other. Any other value leaves the CPU's widest, and the line says
/// so.
const ISA_CAP: (&str, [&str; 3]) = ("EMBEDDING_KERNELS_ISA", ["portable", "avx2", "avx512"]);

/// `text` as a shell reads it back: quoted where it holds a space or a
/// quote.
fn quoted(text: &str) -> String {
    if text.contains(|c: char| c.is_whitespace() || c == '\'') {
        format!("'{}'", text.replace('\'', r"'\''"))
    } else {
        text.to_string()
    }
}

/// The command line, as it would be typed through cargo, after
/// [`ISA_CAP`] where it is set. A value the crate ignores is followed by
/// a note that it was, and a warning goes to standard error.
pub fn line() -> String {
    let mut cmd = String::new();
    let (knob, names) = ISA_CAP;
    if let Some(value) = std::env::var_os(knob) {
        let value = value.to_string_lossy();
        cmd.push_str(&format!("{knob}={} ", quoted(&value)));
        if !names.contains(&value.as_ref()) {
            eprintln!(
                "warning: {knob}={value:?} is none of {}: the CPU's choice stands",
                names.join(", ")
            );
            cmd.push_str("(ignored) ");
        }
    }
    cmd.push_str("cargo run --release --example report");
    let args: Vec<String> = std::env::args().skip(1).map(|a| quoted(&a)).collect();
    if !args.is_empty() {
        cmd = format!("{cmd} -- {}", args.join(" "));
    }
    cmd
}
