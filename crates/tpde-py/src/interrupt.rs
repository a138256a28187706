//! Long operations that Ctrl-C stops: the work runs with the GIL released on a thread of its
//! own while the calling thread, every 50 ms, takes the GIL to let Python run its signal
//! handlers. On `KeyboardInterrupt` (or any exception a handler raises) the work is told to stop
//! ([`tpde::Progress::cancelled`]), its partial output is removed as it unwinds, and the
//! exception is raised once it has. The same thread reports progress to a Python callable, if
//! given, at the same pace: `progress(done, total)` in logical tensor bytes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use pyo3::prelude::*;

/// What the work polls (set once Python raised from a signal handler), and what it reports.
#[derive(Default)]
pub struct Cancel {
    stop: AtomicBool,
    done: AtomicU64,
    total: AtomicU64,
}

impl tpde::Progress for Cancel {
    fn set_length(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }
    fn inc(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }
    fn cancelled(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

impl Cancel {
    /// Calls `progress(done, total)` if the work moved since `last`; a callback's exception
    /// stops the work as Ctrl-C does.
    fn report(&self, progress: Option<&Bound<'_, PyAny>>, last: &mut u64) -> PyResult<()> {
        let (done, total) = (self.done.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed));
        match progress {
            Some(f) if done != *last => {
                *last = done;
                f.call1((done, total)).map(drop)
            }
            _ => Ok(()),
        }
    }
}

/// How often the calling thread looks for signals.
const POLL: Duration = Duration::from_millis(50);

/// Runs `work` so that a signal's exception interrupts it, reporting to `progress` (see the
/// module docs).
pub fn interruptible<'py, T, F>(
    py: Python<'py>,
    progress: Option<&Bound<'py, PyAny>>,
    work: F,
) -> PyResult<Result<T, tpde::Error>>
where
    T: Send,
    F: FnOnce(&Cancel) -> Result<T, tpde::Error> + Send,
{
    let cancel = Cancel::default();
    std::thread::scope(|scope| {
        let (done, finished) = mpsc::channel();
        let cancel = &cancel;
        let worker = scope.spawn(move || {
            let out = work(cancel);
            let _ = done.send(());
            out
        });
        let mut raised = None;
        let mut finished = finished;
        let mut last = 0;
        loop {
            // The receiver goes to the detached closure and back (it is Send, not Sync).
            let (waited, back) = py.detach(move || (finished.recv_timeout(POLL), finished));
            finished = back;
            // Done, or gone (a panic, raised again below by the join).
            if !matches!(waited, Err(mpsc::RecvTimeoutError::Timeout)) {
                break;
            }
            if let Err(e) = py.check_signals().and_then(|()| cancel.report(progress, &mut last)) {
                cancel.stop.store(true, Ordering::Relaxed);
                raised = Some(e);
                let _ = py.detach(move || finished.recv());
                break;
            }
        }
        let out = worker.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        match raised {
            Some(e) => Err(e),
            None => {
                if out.is_ok() {
                    // The last step (done == total). The work is done: a callback that raises
                    // now is reported as unraisable rather than undo a save that happened.
                    if let Err(e) = cancel.report(progress, &mut last) {
                        e.write_unraisable(py, progress);
                    }
                }
                Ok(out)
            }
        }
    })
}
