//! The one way raw pointers reach other threads.

/// A raw pointer, or a small `Copy` value made of raw pointers (a matrix operand, a pointer
/// table), handed to the threads of one parallel call.
///
/// Raw pointers are neither `Send` nor `Sync`, so a closure that captures one cannot run on
/// rayon's pool. The unsafe constructor is where the caller states why the threads that share
/// it do not race; the rest of the code then reads the pointer with [`SendPtr::get`].
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T: Copy>(T);

impl<T: Copy> SendPtr<T> {
    /// Wraps `p` for sharing between threads.
    ///
    /// # Safety
    /// While any copy is in use, the memory reached through it must not race: the threads write
    /// disjoint parts of it (or none), and nothing writes what they read. `T` must own nothing
    /// that is unsound to share, such as a `Cell` or an `Rc`; it is meant for pointers.
    pub(crate) unsafe fn new(p: T) -> SendPtr<T> {
        SendPtr(p)
    }

    /// The wrapped pointer. A method rather than a field, so that closures capture the whole
    /// (sendable) wrapper instead of the (unsendable) field.
    pub(crate) fn get(self) -> T {
        self.0
    }
}

// SAFETY: the constructor's contract: accesses through the pointer do not race.
unsafe impl<T: Copy> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Copy> Sync for SendPtr<T> {}
