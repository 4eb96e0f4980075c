//! Replays every committed fuzz corpus file (`fuzz/corpus/<target>/`, and any crash a run left in
//! `fuzz/artifacts/<target>/`) through the same entry points the fuzz targets call, so CI checks
//! them on stable Rust where no nightly toolchain or cargo-fuzz is installed.

use std::path::Path;

#[test]
fn every_corpus_file_replays_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for target in nodeward::fuzzing::TARGETS {
        let mut files = 0;
        for dir in ["corpus", "artifacts"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("dir entry").path();
                let data = std::fs::read(&path).expect("corpus file");
                let ran = std::panic::catch_unwind(|| nodeward::fuzzing::run(target, &data));
                assert!(
                    ran.as_ref().is_ok_and(|known| *known),
                    "{target}: {} panicked (or the target is unknown)",
                    path.display()
                );
                files += 1;
            }
        }
        assert!(
            files > 0,
            "no corpus for fuzz target {target} under fuzz/corpus/"
        );
        replayed += files;
    }
    eprintln!("replayed {replayed} corpus files");
}
