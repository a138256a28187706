//! `tpde-fuzz-seeds CORPUS OUT`: writes seed inputs made from the conformance corpus into
//! `OUT/<target>/`, the folders cargo-fuzz reads (`fuzz/corpus/<target>/`).

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [corpus, out] = args.as_slice() else {
        eprintln!("usage: tpde-fuzz-seeds CORPUS_DIR OUT_DIR");
        std::process::exit(2);
    };
    let seeds = tpde_fuzzing::seeds(std::path::Path::new(corpus))?;
    for (target, name, bytes) in &seeds {
        let dir = std::path::Path::new(out).join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)?;
    }
    println!("{} seeds in {out}", seeds.len());
    Ok(())
}
