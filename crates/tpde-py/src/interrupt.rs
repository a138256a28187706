//! Long operations that Ctrl-C stops: the work runs with the GIL released on a thread of its
//! own while the calling thread, every 50 ms, takes the GIL to let Python run its signal
//! handlers. On `KeyboardInterrupt` (or any exception a handler raises) the work is told to stop
//! ([`tpde::Progress::cancelled`]), its partial output is removed as it unwinds, and the
//! exception is raised once it has.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use pyo3::prelude::*;

/// What the work polls: set once Python raised from a signal handler.
#[derive(Default)]
pub struct Cancel(AtomicBool);

impl tpde::Progress for Cancel {
    fn cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// How often the calling thread looks for signals.
const POLL: Duration = Duration::from_millis(50);

/// Runs `work` so that a signal's exception interrupts it (see the module docs).
pub fn interruptible<T, F>(py: Python<'_>, work: F) -> PyResult<Result<T, tpde::Error>>
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
        loop {
            // The receiver goes to the detached closure and back (it is Send, not Sync).
            let (waited, back) = py.detach(move || (finished.recv_timeout(POLL), finished));
            finished = back;
            // Done, or gone (a panic, raised again below by the join).
            if !matches!(waited, Err(mpsc::RecvTimeoutError::Timeout)) {
                break;
            }
            if let Err(e) = py.check_signals() {
                cancel.0.store(true, Ordering::Relaxed);
                raised = Some(e);
                let _ = py.detach(move || finished.recv());
                break;
            }
        }
        let out = worker.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        match raised {
            Some(e) => Err(e),
            None => Ok(out),
        }
    })
}
