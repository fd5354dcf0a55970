// SPDX-License-Identifier: GPL-2.0

//! The message path of one connection: the module's QP, receives kept
//! posted, one send at a time.

use super::wait::{wait_for, Wait};
use crate::{
    abi,
    rdma::{
        cm::LockedId,
        verbs::{CompletionHandler, Cq, Pd, Qp, QpCaps, RecvBuffer, SendBuffer},
    },
};
use kernel::{
    new_condvar, new_mutex,
    prelude::*,
    sync::{Arc, CondVar, Mutex},
    uaccess::UserSliceWriter,
};

/// Completions and their waiters; shared by the CQ handler and the ioctls.
#[pin_data]
pub(crate) struct ConnShared {
    /// Received messages, oldest first; their buffers are reposted once read.
    #[pin]
    rx: Mutex<KVec<RecvBuffer>>,
    #[pin]
    rx_ready: CondVar,
    #[pin]
    tx: Mutex<TxState>,
    #[pin]
    tx_done: CondVar,
}

struct TxState {
    /// The send buffer while it is not in flight.
    buf: Option<SendBuffer>,
    /// The result of the last completed send.
    result: Option<Result>,
}

/// The CQ handler of a connection.
pub(crate) struct ConnCompletions {
    shared: Arc<ConnShared>,
}

impl CompletionHandler for ConnCompletions {
    fn recv_done(&self, buf: RecvBuffer, result: Result<usize>) {
        // A flushed receive (teardown) just frees its buffer.
        if result.is_ok() {
            let mut rx = self.shared.rx.lock();
            // Cannot fail: the vector was reserved for every receive buffer.
            if rx.push_within_capacity(buf).is_ok() {
                self.shared.rx_ready.notify_all();
            }
        }
    }

    fn send_done(&self, buf: SendBuffer, result: Result) {
        let mut tx = self.shared.tx.lock();
        tx.buf = Some(buf);
        tx.result = Some(result);
        self.shared.tx_done.notify_all();
    }
}

/// One connection's data path.
pub(crate) struct Conn {
    qp: Arc<Qp<ConnCompletions>>,
    shared: Arc<ConnShared>,
}

/// Send timeout when the caller gives none.
const DEFAULT_SEND_TIMEOUT_MS: u32 = 5000;

impl Conn {
    /// Creates PD, CQ and QP on a locked id and posts the receives.
    pub(crate) fn setup(id: &LockedId<'_>) -> Result<Arc<Self>> {
        let pd = Pd::alloc(id)?;
        let mut rx = KVec::new();
        rx.reserve(abi::RECV_DEPTH, GFP_KERNEL)?;
        let shared = Arc::pin_init(
            pin_init!(ConnShared {
                rx <- new_mutex!(rx),
                rx_ready <- new_condvar!(),
                tx <- new_mutex!(TxState { buf: None, result: None }),
                tx_done <- new_condvar!(),
            }),
            GFP_KERNEL,
        )?;
        let cq = Cq::alloc(
            id,
            (abi::RECV_DEPTH + 4) as u32,
            ConnCompletions {
                shared: shared.clone(),
            },
        )?;
        let qp = id.create_qp(
            &pd,
            &cq,
            QpCaps {
                max_send_wr: 4,
                max_recv_wr: abi::RECV_DEPTH as u32,
            },
        )?;
        for _ in 0..abi::RECV_DEPTH {
            let buf = RecvBuffer::new(&pd, abi::MAX_MESSAGE)?;
            qp.post_recv(buf).map_err(|(e, _)| e)?;
        }
        shared.tx.lock().buf = Some(SendBuffer::new(&pd, abi::MAX_MESSAGE)?);
        Ok(Arc::new(Self { qp, shared }, GFP_KERNEL)?)
    }

    /// Sends one message and waits for its completion.
    pub(crate) fn send(&self, data: &[u8], timeout_ms: u32) -> Result {
        let timeout_ms = if timeout_ms == 0 {
            DEFAULT_SEND_TIMEOUT_MS
        } else {
            timeout_ms
        };
        let mut tx = self.shared.tx.lock();
        // A send that timed out earlier may still hold the buffer.
        wait_for(
            &self.shared.tx_done,
            &mut tx,
            Wait::new(timeout_ms, false),
            |t| t.buf.is_some(),
        )?;
        let Some(mut buf) = tx.buf.take() else {
            return Err(EIO);
        };
        if let Err(e) = buf.fill(data) {
            tx.buf = Some(buf);
            return Err(e);
        }
        tx.result = None;
        if let Err((e, buf)) = self.qp.post_send(buf) {
            tx.buf = Some(buf);
            return Err(e);
        }
        wait_for(
            &self.shared.tx_done,
            &mut tx,
            Wait::new(timeout_ms, false),
            |t| t.result.is_some(),
        )?;
        tx.result.take().unwrap_or(Err(EIO))
    }

    /// Copies the oldest received message to `out` (at most `capacity`
    /// bytes), returns its length and reposts its buffer.
    pub(crate) fn recv(
        &self,
        out: &mut UserSliceWriter,
        capacity: usize,
        wait: Wait,
    ) -> Result<usize> {
        let buf = {
            let mut rx = self.shared.rx.lock();
            wait_for(&self.shared.rx_ready, &mut rx, wait, |q| !q.is_empty())?;
            let len = rx[0].data().len();
            if len > capacity {
                return Err(EMSGSIZE);
            }
            // Copy before dequeuing, so a bad user pointer loses nothing.
            out.write_slice(rx[0].data())?;
            rx.remove(0)?
        };
        let len = buf.data().len();
        // After a disconnect the QP flushes this at once, freeing the buffer.
        let _ = self.qp.post_recv(buf);
        Ok(len)
    }
}
