//! Resolution speed: time per 1,000 resolutions on the real registry and model ids (target ≤ 20 ms
//! per 1,000 on the 2-core machine), plus the cost of loading the registry. Prints figures.
//! Run: `cargo bench -p submitter --bench resolve` (uses ../shared/fixtures when present, else the
//! shipped registry with synthetic ids).

#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::time::Instant;

use submitter::config::lists::read_model_list;
use submitter::registry::{Overrides, Registry};

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let fixtures = root.join("../shared/fixtures/otagent");
    let (registry_dir, ids): (PathBuf, Vec<launch_spec::ModelId>) = if fixtures.join("model_config").is_dir() {
        (fixtures.join("model_config"), read_model_list(&fixtures.join("model-names.txt")).unwrap())
    } else {
        println!("note: fixtures absent; shipped registry with synthetic ids");
        (
            root.join("model_config"),
            (0..1000).map(|i| launch_spec::ModelId::new(format!("org/Model-{}B-v{i}", i % 80)).unwrap()).collect(),
        )
    };
    let mut load_ms = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        let _ = Registry::load(&registry_dir).unwrap();
        load_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let registry = Registry::load(&registry_dir).unwrap();
    let overrides = Overrides::default();
    let mut per_1000_ms = Vec::new();
    for _ in 0..50 {
        for (profile, gpus) in [("default", 4), ("gh200", 1)] {
            let start = Instant::now();
            let mut sink = 0u64;
            for id in &ids {
                sink += u64::from(registry.resolve(id, profile, gpus, &overrides).tensor_parallel_size);
            }
            std::hint::black_box(sink);
            per_1000_ms.push(start.elapsed().as_secs_f64() * 1e3 * 1000.0 / ids.len() as f64);
        }
    }
    println!("registry load ({} files): median {:.2} ms over 20 runs", registry.files.len(), median(load_ms));
    println!(
        "resolution: median {:.3} ms per 1,000 models ({} ids × 2 profiles × 50 runs; target ≤ 20 ms)",
        median(per_1000_ms),
        ids.len()
    );
}
