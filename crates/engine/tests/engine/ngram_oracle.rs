//! mlxcel's hashed n-gram proposers against llama.cpp's: `tests/fixtures/ngram-drafts.txt` holds
//! token streams and every draft llama.cpp's own `common_speculative` proposed over them under
//! several `--spec-type` lists and sizes (written by `scripts/check-ngram-proposers --write`
//! from the reference build); `hashed_drafts` must propose the same drafts at the same steps.

use super::*;

fn tokens(rest: &str) -> Vec<u32> {
    rest.split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}

#[test]
fn hashed_proposers_match_llama_cpp() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ngram-drafts.txt"
    );
    let text =
        std::fs::read_to_string(path).expect("the fixture scripts/check-ngram-proposers writes");
    let mut streams: Vec<(Vec<u32>, Vec<u32>)> = Vec::new();
    let mut lines = text.lines().filter(|l| !l.starts_with('#')).peekable();
    while let Some(line) = lines.next_if(|l| l.starts_with("prompt ")) {
        let output = lines.next().unwrap();
        streams.push((tokens(&line[7..]), tokens(&output[7..])));
    }
    assert!(streams.len() >= 4, "{} streams", streams.len());
    let (mut configs, mut drafts) = (0, 0);
    while let Some(line) = lines.next() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[0], "config", "{line}");
        let n: Vec<u16> = fields[2..].iter().map(|f| f.parse().unwrap()).collect();
        let mut config = SpeculativeConfig::from_flags(Some(fields[1]), false, false, 16, 1, 0.0)
            .unwrap()
            .unwrap();
        let map = |i: usize| NgramMapConfig {
            size_n: n[i],
            size_m: n[i + 1],
            min_hits: n[i + 2],
        };
        config.ngram_map_k = config.ngram_map_k.map(|_| map(0));
        config.ngram_map_k4v = config.ngram_map_k4v.map(|_| map(3));
        config.ngram_mod = config.ngram_mod.map(|_| NgramModConfig {
            n_match: n[6],
            n_min: n[7],
            n_max: n[8],
        });
        configs += 1;
        for (s, (prompt, output)) in streams.iter().enumerate() {
            assert_eq!(lines.next(), Some("stream"));
            let ours = hashed_drafts(&config, prompt, output);
            let mut step = 0;
            while let Some(line) = lines.next_if(|l| l.starts_with("step ")) {
                let want = tokens(&line[5..]);
                let got = ours.get(step).unwrap_or_else(|| {
                    panic!(
                        "{line:?}: {} stream {s}: mlxcel stopped at step {step}",
                        fields[1]
                    )
                });
                assert_eq!(
                    (got.history, &got.draft[..]),
                    (want[0] as usize, &want[1..]),
                    "{} stream {s} step {step}",
                    fields[1..].join(" ")
                );
                drafts += usize::from(!got.draft.is_empty());
                step += 1;
            }
            assert_eq!(ours.len(), step, "{} stream {s}", fields[1]);
            assert_eq!(lines.next(), Some("end"));
        }
    }
    assert!(
        configs >= 5 && drafts >= 100,
        "{configs} configs, {drafts} drafts"
    );
}
