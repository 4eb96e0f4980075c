//! Background tasks tied to their owner's lifetime.

/// Aborts its task when dropped, so a background task (a metrics server, a lease renewer) never
/// outlives what started it.
#[derive(Debug)]
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
