//! The `sluice` command line. The decision core is in the library; the
//! node (`sluice serve`) is built on it in the single-node issue.

fn main() {
    println!("sluice {}", env!("CARGO_PKG_VERSION"));
}
