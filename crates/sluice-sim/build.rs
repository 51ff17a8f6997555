// The simulator's binary interposes `getrandom` (see `src/main.rs`): the
// symbol must be in its dynamic symbol table, where std (through its weak
// `getrandom` lookup) and the `getrandom` crate (through `dlsym`) find it
// before libc's.
fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic-symbol=getrandom");
    println!("cargo:rerun-if-changed=build.rs");
}
