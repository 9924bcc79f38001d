//! llama-server's `return_progress`: a stream's reports of its prompt's processing before the
//! first token (`prompt_progress: {total, cache, processed, time_ms}`). The engine publishes how
//! far each running request's prefill has got after every step ([`RequestProgress`]); the stream
//! reads it while it waits for the first token and reports each advance. The first report is the
//! start (only the cached prefix counts as processed, no time spent) and the last, sent with the
//! first token, has the whole prompt processed, so a stream reports at least these two even when
//! the prompt is computed in one step.

use std::time::Instant;

use mlxcel_engine::RequestProgress;
use serde::Serialize;

/// One report, in llama-server's shape.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PromptProgress {
    /// The prompt's tokens.
    pub total: usize,
    /// Of them, the ones the prefix cache held.
    pub cache: usize,
    /// Of them, the ones processed so far, the cached ones included.
    pub processed: usize,
    /// Milliseconds from submission to this report (0 for the first).
    pub time_ms: f64,
}

/// What one stream has reported so far.
#[derive(Debug)]
pub(crate) struct ProgressReporter {
    total: usize,
    submitted: Instant,
    /// `processed` of the last report; `None` before the first.
    reported: Option<usize>,
    done: bool,
}

impl ProgressReporter {
    /// A reporter for a prompt of `total` tokens submitted at `submitted`.
    pub fn new(total: usize, submitted: Instant) -> Self {
        Self {
            total,
            submitted,
            reported: None,
            done: false,
        }
    }

    /// Whether the last report has been made (the first token has come).
    pub fn done(&self) -> bool {
        self.done
    }

    /// The reports an observation of the request calls for: the first one if not yet made, then
    /// this one if the prefill has advanced since the last.
    pub fn observe(&mut self, seen: &RequestProgress, now: Instant) -> Vec<PromptProgress> {
        let cache = seen.prompt_cached.min(self.total);
        let processed = (cache + seen.prompt_processed).min(self.total);
        self.report(cache, processed, now)
    }

    /// The reports at the first token: the first if not yet made, and the last (the whole prompt
    /// processed). `seen` is the request's last state in the engine, if it is still running
    /// (else its cache is taken as empty). Nothing is reported after.
    pub fn finish(&mut self, seen: Option<&RequestProgress>, now: Instant) -> Vec<PromptProgress> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        let cache = seen.map_or(0, |s| s.prompt_cached.min(self.total));
        self.report(cache, self.total, now)
    }

    fn report(&mut self, cache: usize, processed: usize, now: Instant) -> Vec<PromptProgress> {
        let mut reports = Vec::new();
        if self.reported.is_none() {
            reports.push(PromptProgress {
                total: self.total,
                cache,
                processed: cache,
                time_ms: 0.0,
            });
            self.reported = Some(cache);
        }
        if self.reported.is_some_and(|last| processed > last) {
            reports.push(PromptProgress {
                total: self.total,
                cache,
                processed,
                time_ms: (now - self.submitted).as_secs_f64() * 1e3,
            });
            self.reported = Some(processed);
        }
        reports
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn seen(cached: usize, processed: usize) -> RequestProgress {
        RequestProgress {
            id: 7,
            prompt_processed: processed,
            prompt_cached: cached,
        }
    }

    #[test]
    fn the_first_report_is_the_start_and_the_last_the_whole_prompt() {
        let start = Instant::now();
        let later = start + Duration::from_millis(20);
        let mut reporter = ProgressReporter::new(100, start);
        // Seen mid-prefill: the start first, then the advance.
        let reports = reporter.observe(&seen(10, 30), later);
        assert_eq!(reports.len(), 2);
        assert_eq!((reports[0].cache, reports[0].processed), (10, 10));
        assert_eq!(reports[0].time_ms, 0.0);
        assert_eq!(reports[1].processed, 40);
        assert!((reports[1].time_ms - 20.0).abs() < 1e-6);
        // No advance, no report.
        assert!(reporter.observe(&seen(10, 30), later).is_empty());
        let last = reporter.finish(Some(&seen(10, 90)), later + Duration::from_millis(5));
        assert_eq!(last.len(), 1);
        assert_eq!((last[0].processed, last[0].total), (100, 100));
        assert!(reporter.done());
        assert!(reporter.finish(None, later).is_empty());
    }

    #[test]
    fn a_prompt_computed_in_one_step_still_reports_its_start_and_end() {
        let start = Instant::now();
        let mut reporter = ProgressReporter::new(12, start);
        let reports = reporter.finish(None, start + Duration::from_millis(3));
        assert_eq!(reports.len(), 2);
        assert_eq!((reports[0].processed, reports[0].time_ms), (0, 0.0));
        assert_eq!(reports[1].processed, 12);
        assert!(reports[1].time_ms > 0.0);
    }
}
