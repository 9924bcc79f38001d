//! The capacity rules, tested through the public API only.
//!
//! Modules: `acceptance` (the seed's six-row table), `window` (bounds from the checkpoint window),
//! `env` (environment parsing), `buckets` (server derivation and routing), `properties` (proptest
//! invariants of the resolver).

use mlxcel_capacity::{
    CONTEXT_BUCKETS_ENV, CONTEXT_CAPACITY_ENV, CapacityError, CapacityOverrides,
    DEFAULT_XLA_GENERATION_BUDGET, LADDER, MaxNewTokens, Request, admit, admit_in_window,
    derive_server_buckets, parse_context_buckets, parse_context_capacity, resolve_context_capacity,
    route, server_buckets,
};

const SEED_WINDOW: usize = 131_072;

fn n(value: i64) -> MaxNewTokens {
    MaxNewTokens::from_signed(value).expect("test budgets are -1 or non-negative")
}

/// The validation table of the seed pull request, row for row.
mod acceptance {
    use super::*;

    #[test]
    fn seed_table() {
        struct Row {
            case: &'static str,
            prompt: usize,
            max_new_tokens: i64,
            pinned: Option<usize>,
            expected: Result<&'static str, &'static str>,
        }
        let rows = [
            Row {
                case: "no -n, 6-token prompt",
                prompt: 6,
                max_new_tokens: -1,
                pinned: None,
                expected: Ok("context capacity 1024 for 6 prompt + up to 1018"),
            },
            Row {
                case: "-n 64, 6-token prompt",
                prompt: 6,
                max_new_tokens: 64,
                pinned: None,
                expected: Ok("context capacity 256 for 6 prompt + up to 64"),
            },
            Row {
                case: "553-token prompt, -n 1",
                prompt: 553,
                max_new_tokens: 1,
                pinned: None,
                expected: Ok("context capacity 1024 for 553 prompt + up to 1"),
            },
            Row {
                case: "553-token prompt, no -n",
                prompt: 553,
                max_new_tokens: -1,
                pinned: None,
                expected: Ok("context capacity 2048 for 553 prompt + up to 1495"),
            },
            Row {
                case: "-n 2000, 6-token prompt",
                prompt: 6,
                max_new_tokens: 2000,
                pinned: None,
                expected: Ok("context capacity 2048 for 6 prompt + up to 2000"),
            },
            Row {
                case: "pinned 300, 553-token prompt",
                prompt: 553,
                max_new_tokens: 1,
                pinned: Some(300),
                expected: Err("effective_prompt_len=553 + max_new_tokens=1 > context_capacity=300"),
            },
        ];
        for row in rows {
            let request = Request::text(row.prompt, n(row.max_new_tokens));
            let got = resolve_context_capacity(&request, SEED_WINDOW, row.pinned);
            match (got, row.expected) {
                (Ok(resolution), Ok(line)) => {
                    assert_eq!(
                        resolution.sizing_line().as_deref(),
                        Some(line),
                        "{}",
                        row.case
                    )
                }
                (Err(err), Err(text)) => assert_eq!(err.to_string(), text, "{}", row.case),
                (got, expected) => panic!("{}: got {got:?}, expected {expected:?}", row.case),
            }
        }
    }

    #[test]
    fn pinned_capacity_prints_no_sizing_line() {
        let request = Request::text(6, n(-1));
        let resolution = resolve_context_capacity(&request, SEED_WINDOW, Some(300)).unwrap();
        assert_eq!(resolution.context_capacity, 300);
        assert_eq!(resolution.admitted_max_new_tokens, 294);
        assert!(resolution.pinned);
        assert_eq!(resolution.sizing_line(), None);
    }

    #[test]
    fn pinned_unlimited_without_room_is_refused_like_one_token() {
        let request = Request::text(553, n(-1));
        let err = resolve_context_capacity(&request, SEED_WINDOW, Some(300)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "effective_prompt_len=553 + max_new_tokens=1 > context_capacity=300"
        );
    }

    #[test]
    fn image_tokens_count_towards_the_effective_prompt() {
        let request = Request {
            prompt_len: 6,
            image_tokens: 600,
            max_new_tokens: n(64),
        };
        let resolution = resolve_context_capacity(&request, SEED_WINDOW, None).unwrap();
        assert_eq!(resolution.effective_prompt_len, 606);
        assert_eq!(resolution.context_capacity, 1024);
        assert_eq!(
            resolution.sizing_line().as_deref(),
            Some("context capacity 1024 for 606 prompt + up to 64")
        );
    }

    #[test]
    fn signed_budgets_follow_llama_cpp() {
        assert_eq!(MaxNewTokens::from_signed(-1), Some(MaxNewTokens::Unlimited));
        assert_eq!(MaxNewTokens::from_signed(0), Some(MaxNewTokens::Limited(0)));
        assert_eq!(MaxNewTokens::from_signed(7), Some(MaxNewTokens::Limited(7)));
        assert_eq!(MaxNewTokens::from_signed(-2), None);
    }

    #[test]
    fn admission_honours_or_refuses_explicit_budgets() {
        assert_eq!(admit(6, n(250), 256), Ok(250));
        assert_eq!(admit(6, n(-1), 256), Ok(250));
        assert_eq!(
            admit(6, n(251), 256),
            Err(CapacityError::ExceedsCapacity {
                effective_prompt_len: 6,
                max_new_tokens: 251,
                context_capacity: 256,
            })
        );
        assert!(admit(256, n(-1), 256).is_err());
        assert_eq!(admit(256, n(0), 256), Ok(0));
    }

    #[test]
    fn admission_in_a_window_names_the_window() {
        assert_eq!(admit_in_window(6, n(-1), 8192), Ok(8186));
        assert_eq!(admit_in_window(6, n(100), 8192), Ok(100));
        assert_eq!(
            admit_in_window(9031, n(10), 8192).unwrap_err().to_string(),
            "effective_prompt_len=9031 + max_new_tokens=10 > checkpoint window=8192; \
             shorten the prompt or lower the token budget (-n)"
        );
        assert_eq!(
            admit_in_window(8192, n(-1), 8192),
            Err(CapacityError::ExceedsWindow {
                effective_prompt_len: 8192,
                max_new_tokens: 1,
                window: 8192
            })
        );
    }
}

/// How the checkpoint window bounds the choice.
mod window {
    use super::*;

    fn resolve(
        prompt: usize,
        max_new_tokens: i64,
        window: usize,
    ) -> Result<(usize, usize), String> {
        resolve_context_capacity(&Request::text(prompt, n(max_new_tokens)), window, None)
            .map(|r| (r.context_capacity, r.admitted_max_new_tokens))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn window_below_a_rung_caps_the_capacity() {
        // 6 + min(512, 8186) = 518 needs the 1024 rung; a 700-token window caps it.
        assert_eq!(resolve(6, -1, 700), Ok((700, 694)));
        assert_eq!(resolve(6, 600, 700), Ok((700, 600)));
        assert_eq!(resolve(6, 64, 700), Ok((256, 64)));
    }

    #[test]
    fn window_below_the_smallest_rung() {
        assert_eq!(resolve(6, -1, 100), Ok((100, 94)));
        assert_eq!(resolve(6, 10, 100), Ok((100, 10)));
    }

    #[test]
    fn prompt_that_fills_the_window_is_refused() {
        assert_eq!(
            resolve(8192, -1, 8192),
            Err(
                "effective_prompt_len=8192 + max_new_tokens=1 > checkpoint window=8192; \
                 shorten the prompt or lower the token budget (-n)"
                    .to_owned()
            )
        );
        // One position left is enough for an unlimited budget.
        assert_eq!(resolve(8191, -1, 8192), Ok((8192, 1)));
    }

    #[test]
    fn prompt_plus_budget_beyond_the_window_is_refused_not_shortened() {
        let err = resolve(100, 8100, 8192).unwrap_err();
        assert!(
            err.starts_with(
                "effective_prompt_len=100 + max_new_tokens=8100 > checkpoint window=8192"
            ),
            "{err}"
        );
        assert_eq!(resolve(100, 8092, 8192), Ok((8192, 8092)));
    }

    #[test]
    fn beyond_the_top_rung_is_refused_for_explicit_budgets() {
        let err = resolve(32_000, 1000, SEED_WINDOW).unwrap_err();
        assert!(
            err.starts_with(
                "effective_prompt_len=32000 + max_new_tokens=1000 > largest context capacity=32768"
            ),
            "{err}"
        );
        let err = resolve(40_000, -1, SEED_WINDOW).unwrap_err();
        assert!(err.contains("> largest context capacity=32768"), "{err}");
    }

    #[test]
    fn unlimited_budget_near_the_top_rung_takes_the_room_left() {
        // The sizing budget (512) does not fit under 32768, but the top rung still has room.
        assert_eq!(resolve(32_500, -1, SEED_WINDOW), Ok((32_768, 268)));
    }

    #[test]
    fn zero_window_has_no_capacity() {
        assert_eq!(
            resolve_context_capacity(&Request::text(1, n(1)), 0, None),
            Err(CapacityError::NoCapacities)
        );
    }
}

/// Parsing of the two environment variables, through pure functions.
mod env {
    use super::*;

    #[test]
    fn capacity_values() {
        let cases: &[(&str, Result<usize, &str>)] = &[
            ("1024", Ok(1024)),
            (" 300 ", Ok(300)),
            ("1", Ok(1)),
            ("2147483647", Ok(2_147_483_647)),
            ("", Err("the value is empty")),
            ("   ", Err("the value is empty")),
            ("0", Err("0 is not a positive capacity")),
            ("-5", Err("-5 is not a positive capacity")),
            ("abc", Err("not an integer")),
            ("1.5", Err("not an integer")),
            ("2147483648", Err("2147483648 exceeds the largest capacity")),
            (
                "99999999999999999999999",
                Err("exceeds the largest capacity"),
            ),
        ];
        for (raw, expected) in cases {
            match (parse_context_capacity(raw), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{raw:?}"),
                (Err(err), Err(fragment)) => {
                    let text = err.to_string();
                    assert!(
                        text.starts_with(&format!("{CONTEXT_CAPACITY_ENV}={raw:?}: ")),
                        "{text}"
                    );
                    assert!(text.contains(fragment), "{raw:?}: {text}");
                    assert!(text.contains("1..=2147483647"), "{text}");
                }
                (got, want) => panic!("{raw:?}: got {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn bucket_lists_are_sorted_and_deduplicated() {
        assert_eq!(parse_context_buckets("256,4096"), Ok(vec![256, 4096]));
        assert_eq!(
            parse_context_buckets("4096, 256 ,1024"),
            Ok(vec![256, 1024, 4096])
        );
        assert_eq!(parse_context_buckets("512,512,256,512"), Ok(vec![256, 512]));
        assert_eq!(parse_context_buckets("300"), Ok(vec![300]));
    }

    #[test]
    fn bad_bucket_lists_name_the_variable_and_value() {
        let cases: &[(&str, &str)] = &[
            ("", "the bucket list is empty"),
            ("  ", "the bucket list is empty"),
            ("256,,512", "bucket 2 (\"\")"),
            ("256,", "bucket 2"),
            ("256,abc", "bucket 2 (\"abc\"): not an integer"),
            ("0,256", "bucket 1 (\"0\"): 0 is not a positive capacity"),
            ("-256", "-256 is not a positive capacity"),
            ("256,4294967296", "exceeds the largest capacity"),
        ];
        for (raw, fragment) in cases {
            let text = parse_context_buckets(raw).unwrap_err().to_string();
            assert!(
                text.starts_with(&format!("{CONTEXT_BUCKETS_ENV}={raw:?}: ")),
                "{text}"
            );
            assert!(text.contains(fragment), "{raw:?}: {text}");
        }
    }

    #[test]
    fn overrides_from_a_lookup() {
        let unset = CapacityOverrides::from_lookup(|_| None).unwrap();
        assert_eq!(unset, CapacityOverrides::default());

        let set = CapacityOverrides::from_lookup(|name| match name {
            CONTEXT_CAPACITY_ENV => Some("300".to_owned()),
            CONTEXT_BUCKETS_ENV => Some("4096,256".to_owned()),
            _ => None,
        })
        .unwrap();
        assert_eq!(set.pinned_capacity, Some(300));
        assert_eq!(set.buckets, Some(vec![256, 4096]));

        let bad = CapacityOverrides::from_lookup(|name| {
            (name == CONTEXT_CAPACITY_ENV).then(|| "lots".to_owned())
        })
        .unwrap_err();
        assert_eq!(bad.variable, CONTEXT_CAPACITY_ENV);
        assert_eq!(bad.raw, "lots");
    }
}

/// Server bucket derivation and per-request routing.
mod buckets {
    use super::*;

    #[test]
    fn derived_sets() {
        assert_eq!(derive_server_buckets(131_072, None), vec![256, 4096]);
        assert_eq!(derive_server_buckets(8192, None), vec![256, 4096]);
        assert_eq!(derive_server_buckets(2048, None), vec![256, 2048]);
        assert_eq!(derive_server_buckets(256, None), vec![256]);
        assert_eq!(derive_server_buckets(100, None), vec![100]);
        assert_eq!(derive_server_buckets(131_072, Some(1500)), vec![256, 4096]);
        assert_eq!(
            derive_server_buckets(131_072, Some(6000)),
            vec![256, 4096, 6000]
        );
        assert_eq!(
            derive_server_buckets(5000, Some(6000)),
            vec![256, 4096, 5000]
        );
    }

    #[test]
    fn environment_precedence() {
        let pinned = CapacityOverrides {
            pinned_capacity: Some(300),
            buckets: None,
        };
        assert_eq!(server_buckets(131_072, None, &pinned), vec![300]);
        let both = CapacityOverrides {
            pinned_capacity: Some(300),
            buckets: Some(vec![512, 2048]),
        };
        assert_eq!(server_buckets(131_072, None, &both), vec![512, 2048]);
        let above_window = CapacityOverrides {
            pinned_capacity: None,
            buckets: Some(vec![512, 16384, 32768]),
        };
        assert_eq!(server_buckets(8192, None, &above_window), vec![512, 8192]);
    }

    #[test]
    fn routing_picks_the_smallest_bucket_for_the_whole_budget() {
        let buckets = [256, 4096];
        /// Prompt, budget, and the expected (bucket, admitted budget) or error fragment.
        type Case = (usize, i64, Result<(usize, usize), &'static str>);
        let cases: &[Case] = &[
            (6, 64, Ok((256, 64))),
            (6, 250, Ok((256, 250))),
            (6, 251, Ok((4096, 251))),
            (415, 8, Ok((4096, 8))),
            (6, -1, Ok((4096, 4090))),
            (4000, -1, Ok((4096, 96))),
            (4096, 1, Err("> largest context capacity=4096")),
            (100, 4000, Err("> largest context capacity=4096")),
            (131_072, 1, Err("> checkpoint window=131072")),
        ];
        for &(prompt, max_new, ref expected) in cases {
            let got = route(&buckets, SEED_WINDOW, prompt, n(max_new));
            match (got, expected) {
                (Ok(r), Ok((bucket, admitted))) => {
                    assert_eq!((r.bucket, r.admitted_max_new_tokens), (*bucket, *admitted))
                }
                (Err(e), Err(fragment)) => {
                    assert!(e.to_string().contains(fragment), "{prompt}+{max_new}: {e}")
                }
                (got, want) => panic!("{prompt}+{max_new}: got {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn routing_without_buckets_is_an_error() {
        assert_eq!(
            route(&[], SEED_WINDOW, 1, n(1)),
            Err(CapacityError::NoCapacities)
        );
    }
}

/// Invariants of the resolver over arbitrary requests.
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn budgets() -> impl Strategy<Value = MaxNewTokens> {
        prop_oneof![
            Just(MaxNewTokens::Unlimited),
            (0usize..40_000).prop_map(MaxNewTokens::Limited),
        ]
    }

    proptest! {
        #[test]
        fn chosen_capacity_admits_fits_the_window_and_is_smallest(
            prompt in 0usize..40_000,
            image in 0usize..2_000,
            max_new_tokens in budgets(),
            window in 1usize..140_000,
        ) {
            let request = Request { prompt_len: prompt, image_tokens: image, max_new_tokens };
            let eff = request.effective_prompt_len();
            if let Ok(r) = resolve_context_capacity(&request, window, None) {
                prop_assert!(r.context_capacity <= window);
                prop_assert!(eff + r.admitted_max_new_tokens <= r.context_capacity);
                prop_assert!(admit(eff, max_new_tokens, r.context_capacity).is_ok());
                match max_new_tokens {
                    MaxNewTokens::Limited(n) => prop_assert_eq!(r.admitted_max_new_tokens, n),
                    MaxNewTokens::Unlimited => {
                        prop_assert!(r.admitted_max_new_tokens >= 1);
                        prop_assert_eq!(r.admitted_max_new_tokens, r.context_capacity - eff);
                    }
                }
                // No smaller capacity on offer would have held the sizing budget.
                let sizing = match max_new_tokens {
                    MaxNewTokens::Limited(n) => n,
                    MaxNewTokens::Unlimited => DEFAULT_XLA_GENERATION_BUDGET.min(window - eff),
                };
                for rung in LADDER.iter().map(|&c| c.min(window)) {
                    if rung < r.context_capacity {
                        prop_assert!(rung < eff + sizing);
                    }
                }
            }
        }

        #[test]
        fn refusals_are_genuine(
            prompt in 0usize..40_000,
            max_new_tokens in budgets(),
            window in 1usize..140_000,
        ) {
            let request = Request::text(prompt, max_new_tokens);
            if resolve_context_capacity(&request, window, None).is_err() {
                // Not even the least the request needs fits any capacity on offer.
                let least = match max_new_tokens {
                    MaxNewTokens::Unlimited => 1,
                    MaxNewTokens::Limited(n) => n,
                };
                let best = LADDER.iter().map(|&c| c.min(window)).max().unwrap();
                prop_assert!(prompt + least > best);
            }
        }

        #[test]
        fn unlimited_budget_always_fits_its_shape(prompt in 0usize..32_000, window in 1usize..140_000) {
            let request = Request::text(prompt, MaxNewTokens::Unlimited);
            if let Ok(r) = resolve_context_capacity(&request, window, None) {
                prop_assert_eq!(prompt + r.admitted_max_new_tokens, r.context_capacity);
            } else {
                prop_assert!(prompt >= window.min(32_768));
            }
        }

        #[test]
        fn routing_matches_a_linear_scan(
            raw in proptest::collection::vec(1usize..20_000, 1..6),
            prompt in 0usize..20_000,
            max_new in 0usize..20_000,
        ) {
            let window = 131_072;
            let mut buckets = raw.clone();
            buckets.sort_unstable();
            buckets.dedup();
            let got = route(&buckets, window, prompt, MaxNewTokens::Limited(max_new));
            let expected = buckets.iter().copied().find(|&b| b >= prompt + max_new);
            prop_assert_eq!(got.ok().map(|r| r.bucket), expected);
        }
    }
}
