//! One fresh process's read of a whole checkpoint through `Reader::read_tensor`, tensor by
//! tensor, each into a new buffer, as a Rust program that embeds the reader does; a delta reads
//! its base where its hint names it. Prints the wall milliseconds.
//!
//!     cargo run --release -p tpde --example read_tensors -- FILE.tpde

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: read_tensors FILE.tpde")?;
    let r = tpde::read::open_chain(&path)?;
    let t0 = std::time::Instant::now();
    let mut bytes = 0;
    for t in r.tensors() {
        bytes += std::hint::black_box(r.read_tensor(t)?).len();
    }
    println!("{:.2} ms, {bytes} bytes", t0.elapsed().as_secs_f64() * 1e3);
    Ok(())
}
