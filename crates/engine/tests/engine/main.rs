//! The engine's public behaviour, one module per concern.
//!
//! Modules: `sampling` (the sampler chain and seeding), `stop` (stop strings across token
//! boundaries), `seam` (the backend trait's defaults), `scheduler` (continuous batching over a
//! mock backend), `default_model` (the public `Engine` on the real default model; needs the `mlx`
//! feature, and its OpenXLA tests the `xla` feature), `metrics` (histograms), `families` (tiny
//! random checkpoints of each model family through both backends, compared with each other),
//! `hybrid_state` (a gated-DeltaNet hybrid's recurrent state through the prefix cache,
//! speculative decoding, saved slots, cancellation and the KV budget), `hashed_speculation`
//! (llama.cpp's hashed n-gram proposers on the default model), `ngram_oracle` (their drafts
//! against llama.cpp's own, from a fixture its code wrote).

use mlxcel_engine::*;

#[cfg(feature = "mlx")]
mod default_model;
#[cfg(all(feature = "mlx", feature = "xla"))]
mod families;
#[cfg(feature = "mlx")]
mod hashed_speculation;
#[cfg(all(feature = "mlx", feature = "xla"))]
mod hybrid_state;
mod metrics;
mod ngram_oracle;
mod scheduler;

mod sampling {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(1234),
            ..SamplingParams::default()
        }
    }

    fn frequencies(sampler: &mut Sampler, logits: &[f32], draws: usize) -> Vec<f64> {
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..draws {
            let mut l = logits.to_vec();
            counts[sampler.sample(&mut l, &[]) as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    /// Logits whose softmax is exactly `probs`.
    fn logits_of(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    #[test]
    fn greedy_is_argmax_with_lowest_index_on_ties_and_ignores_nan() {
        let mut greedy = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(greedy.sample(&mut [0.0, 3.0, 1.0], &[]), 1);
        assert_eq!(greedy.sample(&mut [2.0, 5.0, 5.0], &[]), 1);
        assert_eq!(greedy.sample(&mut [f32::NAN, -1.0, -2.0], &[]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn top_k_of_one_is_greedy_at_any_temperature() {
        let mut sampler = Sampler::new(SamplingParams {
            top_k: 1,
            ..params(5.0)
        })
        .unwrap();
        for _ in 0..200 {
            assert_eq!(sampler.sample(&mut [0.5, 0.4, 0.6, 0.1], &[]), 2);
        }
    }

    #[test]
    fn draws_follow_the_softmax() {
        let probs = [0.5, 0.3, 0.15, 0.05];
        let mut sampler = Sampler::new(params(1.0)).unwrap();
        let freq = frequencies(&mut sampler, &logits_of(&probs), 40_000);
        for (f, p) in freq.iter().zip(probs) {
            assert!((f - p).abs() < 0.01, "{freq:?} vs {probs:?}");
        }
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
        let cold = frequencies(&mut Sampler::new(params(0.25)).unwrap(), &logits, 20_000);
        let hot = frequencies(&mut Sampler::new(params(4.0)).unwrap(), &logits, 20_000);
        // At T=0.25 the odds are raised to the 4th power: 0.5^4 / sum = ~0.88.
        assert!((cold[0] - 0.8757).abs() < 0.015, "{cold:?}");
        assert!(hot[3] > 0.15, "{hot:?}");
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
        let mut sampler = Sampler::new(SamplingParams {
            top_p: 0.75,
            ..params(1.0)
        })
        .unwrap();
        let freq = frequencies(&mut sampler, &logits, 20_000);
        assert_eq!((freq[2], freq[3]), (0.0, 0.0), "{freq:?}");
        assert!(
            (freq[0] - 0.625).abs() < 0.015,
            "renormalised 0.5/0.8: {freq:?}"
        );
    }

    #[test]
    fn min_p_drops_tokens_below_the_scaled_floor() {
        let logits = logits_of(&[0.5, 0.3, 0.15, 0.05]);
        let mut sampler = Sampler::new(SamplingParams {
            min_p: 0.5,
            ..params(1.0)
        })
        .unwrap();
        let freq = frequencies(&mut sampler, &logits, 20_000);
        assert!(freq[1] > 0.3, "{freq:?}");
        assert_eq!((freq[2], freq[3]), (0.0, 0.0), "{freq:?}");
    }

    #[test]
    fn same_seed_same_tokens_other_seed_other_tokens() {
        let logits = vec![0.0f32; 1000];
        let run = |seed| {
            let mut sampler = Sampler::new(SamplingParams {
                seed: Some(seed),
                ..params(1.0)
            })
            .unwrap();
            (0..32)
                .map(|_| sampler.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let unseeded = Sampler::new(SamplingParams::default()).unwrap();
        let replay = Sampler::new(SamplingParams {
            seed: Some(unseeded.seed()),
            ..SamplingParams::default()
        })
        .unwrap();
        assert_eq!(unseeded.seed(), replay.seed());
    }

    #[test]
    fn repeat_penalty_divides_positive_and_multiplies_negative_logits() {
        let mut sampler = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            ..SamplingParams::greedy()
        })
        .unwrap();
        let mut logits = [4.0, -1.0, 3.0, 0.5];
        // Token 0 is penalised to 2.0, below token 2's 3.0.
        assert_eq!(sampler.sample(&mut logits, &[0, 1, 0]), 2);
        assert_eq!(logits, [2.0, -2.0, 3.0, 0.5]);
    }

    #[test]
    fn presence_and_frequency_penalties_subtract() {
        let mut sampler = Sampler::new(SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::greedy()
        })
        .unwrap();
        let mut logits = [1.0, 1.0, 1.0];
        sampler.sample(&mut logits, &[0, 0, 0, 2]);
        assert_eq!(logits, [1.0 - 0.75 - 0.5, 1.0, 1.0 - 0.25 - 0.5]);
    }

    #[test]
    fn penalties_only_look_at_the_last_n_tokens() {
        let mut sampler = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            repeat_last_n: 2,
            ..SamplingParams::greedy()
        })
        .unwrap();
        let mut logits = [4.0, 4.0, 4.0];
        sampler.sample(&mut logits, &[0, 1, 2]);
        assert_eq!(logits, [4.0, 2.0, 2.0]);
    }

    #[test]
    fn invalid_parameters_name_the_field() {
        let cases = [
            (
                SamplingParams {
                    top_p: 0.0,
                    ..SamplingParams::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    top_p: 1.5,
                    ..SamplingParams::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    min_p: -0.1,
                    ..SamplingParams::default()
                },
                "min_p",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..SamplingParams::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    repeat_penalty: 0.0,
                    ..SamplingParams::default()
                },
                "repeat_penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: 3.0,
                    ..SamplingParams::default()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: -2.5,
                    ..SamplingParams::default()
                },
                "frequency_penalty",
            ),
        ];
        for (params, field) in cases {
            let err = Sampler::new(params).unwrap_err().to_string();
            assert!(err.starts_with(&format!("invalid {field}=")), "{err}");
        }
    }
}

mod stop {
    use super::*;
    use proptest::prelude::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut matcher = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        for piece in pieces {
            let scan = matcher.push(piece);
            out.push_str(&scan.text);
            if scan.stopped {
                return (out, true);
            }
        }
        out.push_str(&matcher.finish());
        (out, false)
    }

    #[test]
    fn a_stop_split_across_tokens_is_never_shown() {
        let mut matcher = StopMatcher::new(["<|im_end|>"]);
        assert_eq!(matcher.push("Hello <|im").text, "Hello ");
        let scan = matcher.push("_end|> tail");
        assert_eq!(
            scan,
            StopScan {
                text: String::new(),
                stopped: true
            }
        );
        assert!(matcher.push("more").stopped);
    }

    #[test]
    fn held_text_is_released_when_it_cannot_become_a_stop() {
        assert_eq!(
            run(&["STOP"], &["a S", "T", "x", "y"]),
            ("a STxy".to_owned(), false)
        );
        assert_eq!(run(&["STOP"], &["a S", "T"]), ("a ST".to_owned(), false));
    }

    #[test]
    fn the_earliest_of_several_stops_wins() {
        assert_eq!(
            run(&["world", "lo"], &["hello world"]),
            ("hel".to_owned(), true)
        );
    }

    #[test]
    fn multibyte_text_splits_on_character_boundaries() {
        assert_eq!(run(&["é!"], &["café", "!"]), ("caf".to_owned(), true));
        assert_eq!(run(&["é!"], &["café", "?"]), ("café?".to_owned(), false));
        assert_eq!(run(&["🙂🙃"], &["x🙂", "🙂🙃"]), ("x🙂".to_owned(), true));
    }

    #[test]
    fn empty_stops_are_ignored() {
        assert_eq!(run(&[""], &["abc"]), ("abc".to_owned(), false));
    }

    proptest! {
        #[test]
        fn output_is_the_text_before_the_first_stop_however_it_is_split(
            text in "[ab\u{e9}<>]{0,24}",
            stop in "[ab\u{e9}<>]{1,3}",
            cuts in proptest::collection::vec(0usize..24, 0..6),
        ) {
            let chars: Vec<char> = text.chars().collect();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(chars.len())).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut last = 0;
            for cut in cuts.into_iter().chain([chars.len()]) {
                pieces.push(chars[last..cut].iter().collect::<String>());
                last = cut;
            }
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (out, stopped) = run(&[stop.as_str()], &refs);
            match text.find(&stop) {
                Some(at) => {
                    prop_assert!(stopped);
                    prop_assert_eq!(out, &text[..at]);
                }
                None => {
                    prop_assert!(!stopped);
                    prop_assert_eq!(out, text);
                }
            }
        }
    }
}

mod seam {
    use super::*;

    /// The smallest backend: a fixed window, no model.
    struct Fixed;

    impl Backend for Fixed {
        fn name(&self) -> &'static str {
            "fixed"
        }
        fn window(&self) -> usize {
            100
        }
        fn vocab_size(&self) -> usize {
            4
        }
        fn allocate_slot(&mut self, _plan: &SessionPlan) -> Result<SlotId, EngineError> {
            Ok(0)
        }
        fn step(&mut self, batch: &[SequenceStep<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
            Ok(batch.iter().map(|_| vec![0.0; 4]).collect())
        }
        fn release_slot(&mut self, _slot: SlotId) {}
    }

    fn shape(prompt_len: usize, max_new_tokens: MaxNewTokens) -> RequestShape {
        RequestShape {
            prompt_len,
            image_tokens: 0,
            max_new_tokens,
        }
    }

    #[test]
    fn default_plan_is_dynamic_and_bounded_by_the_window() {
        assert_eq!(Fixed.shape_policy(), ShapePolicy::Dynamic);
        let plan = Fixed
            .create_session_for_request(&shape(6, MaxNewTokens::Limited(10)))
            .unwrap();
        assert_eq!(
            plan,
            SessionPlan {
                context_capacity: None,
                max_positions: 100,
                admitted_max_new_tokens: 10
            }
        );
        let unlimited = Fixed
            .create_session_for_request(&shape(6, MaxNewTokens::Unlimited))
            .unwrap();
        assert_eq!(unlimited.admitted_max_new_tokens, 94);
    }

    #[test]
    fn default_plan_refuses_what_the_window_cannot_hold() {
        let err = Fixed
            .create_session_for_request(&shape(6, MaxNewTokens::Limited(95)))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "effective_prompt_len=6 + max_new_tokens=95 > checkpoint window=100; \
             shorten the prompt or lower the token budget (-n)"
        );
    }
}
