//! The bounds of one render: the bytes it prints and the time it takes, counted per thread, and
//! the output buffer that refuses bytes past them.

use std::cell::Cell;
use std::time::{Duration, Instant};

use minijinja::Error;

/// The most bytes one render may print through `{{ … }}` (counted as printed, also inside a
/// `{% set %}` block, a macro or a filter block whose text is captured before it reaches the
/// output) and the most bytes its output may hold. A real prompt is a few hundred kilobytes at
/// most (a request body is at most 8 MiB); a template that prints gigabytes (a loop over a
/// repeated string) stops here instead of exhausting memory.
pub const MAX_RENDER_BYTES: usize = 64 << 20;

/// The longest one render may take by default ([`ChatTemplate::with_time_limit`]), checked
/// whenever it prints. Fuel bounds instructions (20 million run in a second or two in a release
/// build, in tens of seconds in a loaded debug build); this bounds instructions that are each
/// expensive (copying large strings), which fuel does not.
pub const MAX_RENDER_TIME: Duration = Duration::from_secs(60);

/// A bound of [`MAX_RENDER_BYTES`] or [`MAX_RENDER_TIME`] that a render ran past: the source of
/// the minijinja error that stops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RenderLimit {
    Bytes,
    Time(Duration),
}

impl std::fmt::Display for RenderLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderLimit::Bytes => write!(
                f,
                "printed more than {} MiB (does it loop forever?)",
                MAX_RENDER_BYTES >> 20
            ),
            RenderLimit::Time(limit) => write!(
                f,
                "ran past {} s (does it loop forever?)",
                limit.as_secs_f64()
            ),
        }
    }
}

impl std::error::Error for RenderLimit {}

/// The limit in `e`'s chain of sources, if a render ran past one.
pub(super) fn limit_of(e: &Error) -> Option<RenderLimit> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(limit) = s.downcast_ref::<RenderLimit>() {
            return Some(*limit);
        }
        // An `io::Error`'s `source()` skips the error it wraps: look inside.
        if let Some(limit) = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<RenderLimit>())
        {
            return Some(*limit);
        }
        source = s.source();
    }
    None
}

/// What the render on this thread has printed so far, and when it must end. Renders are
/// synchronous, so a thread-local is the render's own.
#[derive(Debug, Clone, Copy)]
struct Budget {
    printed: usize,
    deadline: Instant,
    limit: Duration,
}

thread_local! {
    static BUDGET: Cell<Option<Budget>> = const { Cell::new(None) };
}

/// The budget of one render, from [`RenderBudget::start`] until dropped (a render inside another
/// one, which no template can start, would get its own and restore the outer one's).
pub(super) struct RenderBudget(Option<Budget>);

impl RenderBudget {
    pub(super) fn start(limit: Duration) -> Self {
        Self(BUDGET.replace(Some(Budget {
            printed: 0,
            deadline: Instant::now() + limit,
            limit,
        })))
    }
}

impl Drop for RenderBudget {
    fn drop(&mut self) {
        BUDGET.set(self.0);
    }
}

/// Counts `bytes` printed against the render's budget; an error once past a bound.
pub(super) fn charge(bytes: usize) -> std::result::Result<(), RenderLimit> {
    let Some(mut budget) = BUDGET.get() else {
        return Ok(());
    };
    budget.printed = budget.printed.saturating_add(bytes);
    BUDGET.set(Some(budget));
    if budget.printed > MAX_RENDER_BYTES {
        Err(RenderLimit::Bytes)
    } else if Instant::now() > budget.deadline {
        Err(RenderLimit::Time(budget.limit))
    } else {
        Ok(())
    }
}

/// The render's output, refused past [`MAX_RENDER_BYTES`] or [`MAX_RENDER_TIME`].
pub(super) struct BoundedOutput(pub(super) Vec<u8>);

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len().saturating_add(buf.len()) > MAX_RENDER_BYTES {
            return Err(std::io::Error::other(RenderLimit::Bytes));
        }
        if let Some(budget) = BUDGET.get()
            && Instant::now() > budget.deadline
        {
            return Err(std::io::Error::other(RenderLimit::Time(budget.limit)));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
