//! One RC queue pair with its completion queue, buffers and completion task: the part
//! shared by both ends. Carries one-sided READs (client), messages as fragmented SENDs
//! into posted receive buffers (both ends), and probes.
//!
//! Work-request ids say what completed: READ (a pending read's id), SEND (the index of
//! the send buffer, returned to the pool) or RECV (the index of the receive buffer:
//! its fragment is taken, then the buffer is posted again).

use super::{Device, RdmaError};
use crate::fragment::{FRAGMENT_HEADER, Piece, Reassembler};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue, WorkCompletionStatus};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState, SetScatterGatherEntry,
    WorkRequestFlags,
};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::{Semaphore, oneshot};
use tracing::{debug, warn};

/// Bytes of one bounce buffer for READs (and at most one READ work request).
pub const BOUNCE_BYTES: usize = 1 << 20;

/// READ bounce buffers per device (reads beyond wait: back-pressure).
pub(super) const BOUNCE_BUFFERS: usize = 32;

/// Bytes of a send or receive buffer: one fragment, header included.
pub const MESSAGE_BUFFER: usize = 32 << 10;

/// Receive buffers posted per queue pair (1 MiB per queue pair).
pub(super) const RECV_BUFFERS: usize = 32;

/// Send buffers per queue pair.
const SEND_BUFFERS: usize = 32;

/// Send work requests in flight per queue pair (READs and SENDs).
pub(super) const SEND_DEPTH: u32 = (BOUNCE_BUFFERS + SEND_BUFFERS) as u32;

/// Messages being reassembled at once per queue pair.
const MAX_PARTIAL: usize = 256;

const KIND_SHIFT: u32 = 62;
const WR_READ: u64 = 0;
const WR_SEND: u64 = 1;
const WR_RECV: u64 = 2;

/// Called with each whole message received: (endpoint, message id, bytes).
pub(super) type OnMessage = Box<dyn Fn(&Arc<Endpoint>, u64, Bytes) + Send + Sync>;

/// A registered buffer. Field order matters: the registration is dropped (deregistered)
/// before the memory is freed.
pub(crate) struct Buffer {
    mr: Arc<MemoryRegion>,
    mem: Box<[u8]>,
}

impl Buffer {
    fn new(pd: &Arc<ProtectionDomain>, len: usize) -> Result<Buffer, RdmaError> {
        let mem = vec![0u8; len].into_boxed_slice();
        // SAFETY: the heap block does not move when the box does; `Buffer` holds the only
        // handle to the registration and drops it before the memory, and the NIC touches
        // the memory only while a work request on it is posted (see the callers).
        let mr = unsafe { super::register_in(pd, mem.as_ptr(), mem.len(), AccessFlags::LocalWrite) }
            .map_err(|e| RdmaError::Setup(format!("buffer: {e}")))?;
        Ok(Buffer { mr, mem })
    }

    fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
}

struct ChannelFd(Arc<CompletionChannel>);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// One queue pair and what it needs.
pub(super) struct Endpoint {
    dev: Arc<Device>,
    /// The queue pair's protection domain (its message buffers are registered there).
    pd: Arc<ProtectionDomain>,
    qp: Mutex<BasicQueuePair>,
    cq: Arc<BasicCompletionQueue>,
    /// READs waiting for their completion.
    reads: Mutex<HashMap<u64, oneshot::Sender<Result<(), RdmaError>>>>,
    next_read: AtomicU64,
    /// Send buffers by index (`None` while posted) and the free indexes.
    send: Mutex<(Vec<Option<Buffer>>, Vec<usize>)>,
    send_permits: Semaphore,
    recv: Vec<Buffer>,
    /// The largest message accepted.
    max_message: usize,
    on_message: OnMessage,
    broken: AtomicBool,
    why: Mutex<Option<RdmaError>>,
    /// Time of the last successful completion (liveness of the peer).
    last_ok: Mutex<Instant>,
    probing: AtomicBool,
    task: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().take() {
            t.abort();
        }
    }
}

impl Endpoint {
    /// Takes a connected (ready-to-send) queue pair: posts the receive buffers and starts
    /// the completion task.
    pub(super) fn start(
        dev: Arc<Device>,
        pd: Arc<ProtectionDomain>,
        mut qp: BasicQueuePair,
        cq: Arc<BasicCompletionQueue>,
        channel: Arc<CompletionChannel>,
        max_message: usize,
        on_message: OnMessage,
    ) -> Result<Arc<Endpoint>, RdmaError> {
        let mut recv = Vec::with_capacity(RECV_BUFFERS);
        for i in 0..RECV_BUFFERS {
            let b = Buffer::new(&pd, MESSAGE_BUFFER)?;
            post_recv(&mut qp, i, &b)?;
            recv.push(b);
        }
        let ep = Arc::new(Endpoint {
            dev,
            pd,
            qp: Mutex::new(qp),
            cq,
            reads: Mutex::new(HashMap::new()),
            next_read: AtomicU64::new(1),
            send: Mutex::new((
                (0..SEND_BUFFERS).map(|_| None).collect(),
                (0..SEND_BUFFERS).rev().collect(),
            )),
            send_permits: Semaphore::new(SEND_BUFFERS),
            recv,
            max_message,
            on_message,
            broken: AtomicBool::new(false),
            why: Mutex::new(None),
            last_ok: Mutex::new(Instant::now()),
            probing: AtomicBool::new(false),
            task: Mutex::new(None),
        });
        channel
            .set_nonblocking(true)
            .map_err(|e| RdmaError::Setup(format!("completion channel: {e}")))?;
        // SAFETY: the descriptor belongs to the channel `ChannelFd` holds: open, and the
        // same, for as long as the AsyncFd lives.
        let fd = unsafe { AsyncFd::register(ChannelFd(channel)) }
            .map_err(|e| RdmaError::Setup(format!("completion channel: {e}")))?;
        let task = tokio::spawn(completions(Arc::downgrade(&ep), fd));
        *ep.task.lock() = Some(task.abort_handle());
        Ok(ep)
    }

    /// True once a work request failed or the endpoint was closed.
    pub(super) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Why it broke.
    pub(super) fn why(&self) -> RdmaError {
        self.why
            .lock()
            .clone()
            .unwrap_or_else(|| RdmaError::Post("queue pair closed".into()))
    }

    /// Marks the endpoint failed: every waiting read fails; the owner drops it.
    pub(super) fn fail(&self, e: RdmaError) {
        if self.broken.swap(true, Ordering::Relaxed) {
            return;
        }
        debug!(error = %e, "RDMA queue pair failed");
        *self.why.lock() = Some(e.clone());
        let reads: Vec<_> = self.reads.lock().drain().collect();
        for (_, tx) in reads {
            let _ = tx.send(Err(e.clone()));
        }
    }

    /// Closes: the queue pair goes to the error state (the peer's next work request
    /// fails) and the endpoint is marked failed.
    pub(super) fn close(&self) {
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        let _ = self.qp.lock().modify(&attr);
        self.fail(RdmaError::Post("queue pair closed".into()));
    }

    /// True when no SEND is in flight (every send buffer is back).
    pub(super) fn sends_idle(&self) -> bool {
        self.send_permits.available_permits() == SEND_BUFFERS
    }

    /// How long since the last successful completion.
    pub(super) fn idle_for(&self) -> Duration {
        self.last_ok.lock().elapsed()
    }

    /// One RDMA READ of `n` ≤ [`BOUNCE_BYTES`] bytes at `addr`.
    /// READs `n` bytes at (`addr`, `rkey`) and appends them to `out` (one copy, out of
    /// the bounce buffer). `out` comes back in every case.
    pub(super) async fn read_into(
        &self,
        addr: u64,
        rkey: u32,
        n: usize,
        timeout: Duration,
        mut out: BytesMut,
    ) -> (Result<(), RdmaError>, BytesMut) {
        match self
            .read_with(addr, rkey, n, timeout, |bytes| out.extend_from_slice(bytes))
            .await
        {
            Ok(()) => (Ok(()), out),
            Err(e) => (Err(e), out),
        }
    }

    async fn read_with(
        &self,
        addr: u64,
        rkey: u32,
        n: usize,
        timeout: Duration,
        take: impl FnOnce(&[u8]),
    ) -> Result<(), RdmaError> {
        let _permit = self
            .dev
            .bounce_permits
            .acquire()
            .await
            .map_err(|_| RdmaError::Post("queue pair closed".into()))?;
        if self.is_broken() {
            return Err(self.why());
        }
        let mut bounce = match self.dev.bounce.lock().pop() {
            Some(b) => b,
            None => Buffer::new(&self.dev.pd, BOUNCE_BYTES)?,
        };
        let id = self.next_read.fetch_add(1, Ordering::Relaxed) & ((1 << KIND_SHIFT) - 1);
        let (tx, rx) = oneshot::channel();
        self.reads.lock().insert(id, tx);
        let posted = {
            let mut qp = self.qp.lock();
            let mut guard = qp.start_post_send();
            let wr = guard
                .construct_wr((WR_READ << KIND_SHIFT) | id, WorkRequestFlags::Signaled)
                .setup_read(rkey, addr);
            // SAFETY: the buffer stays alive and untouched until the completion (on a
            // timeout it is leaked below rather than reused).
            unsafe { wr.setup_sge(bounce.mr.lkey(), bounce.mem.as_mut_ptr() as u64, n as u32) };
            guard.post().map_err(|e| RdmaError::Post(e.to_string()))
        };
        if let Err(e) = posted {
            self.reads.lock().remove(&id);
            self.dev.bounce.lock().push(bounce);
            self.fail(e.clone());
            return Err(e);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(()))) => {
                take(&bounce.mem[..n]);
                self.dev.bounce.lock().push(bounce);
                Ok(())
            }
            Ok(Ok(Err(e))) => {
                // Failed or flushed: the NIC is done with the buffer, but the queue pair
                // is in error; the buffer goes with it.
                Err(e)
            }
            Ok(Err(_)) => Err(self.why()),
            Err(_) => {
                // The NIC may still write into the buffer: never reuse it.
                self.fail(RdmaError::Timeout(timeout));
                std::mem::forget(bounce);
                Err(RdmaError::Timeout(timeout))
            }
        }
    }

    /// Sends one message as fragments, in order. Returns once all are posted (their
    /// completions return the buffers).
    pub(super) async fn send_message(&self, id: u64, message: &[u8]) -> Result<(), RdmaError> {
        let data_max = MESSAGE_BUFFER - FRAGMENT_HEADER;
        for (h, data) in crate::fragment::split(id, message, data_max) {
            self.send_fragment(&h, data).await?;
        }
        Ok(())
    }

    /// Sends a probe if none is in flight: a dead peer fails it within the transport
    /// retry time (about half a second), which fails the endpoint.
    pub(super) async fn probe(&self) {
        if self.probing.swap(true, Ordering::Relaxed) {
            return;
        }
        let r = self.send_fragment(&crate::fragment::noop(), &[]).await;
        self.probing.store(false, Ordering::Relaxed);
        if let Err(e) = r {
            self.fail(e);
        }
    }

    /// Tells the peer this queue pair closes (its waiting calls fail at once), and waits
    /// a little for that and earlier replies to leave.
    pub(super) async fn say_goodbye(&self) {
        if self.is_broken() {
            return;
        }
        let _ = self.send_fragment(&crate::fragment::close(), &[]).await;
        let until = Instant::now() + Duration::from_millis(500);
        while !self.sends_idle() && !self.is_broken() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn send_fragment(&self, header: &[u8; FRAGMENT_HEADER], data: &[u8]) -> Result<(), RdmaError> {
        let permit = self
            .send_permits
            .acquire()
            .await
            .map_err(|_| RdmaError::Post("queue pair closed".into()))?;
        if self.is_broken() {
            return Err(self.why());
        }
        let (idx, slot) = {
            let mut s = self.send.lock();
            let idx = s.1.pop().ok_or_else(|| RdmaError::Post("no send buffer".into()))?;
            (idx, s.0[idx].take())
        };
        let mut buf = match slot {
            Some(b) => b,
            None => match Buffer::new(&self.pd, MESSAGE_BUFFER) {
                Ok(b) => b,
                Err(e) => {
                    self.send.lock().1.push(idx);
                    return Err(e);
                }
            },
        };
        let len = FRAGMENT_HEADER + data.len();
        buf.mem[..FRAGMENT_HEADER].copy_from_slice(header);
        buf.mem[FRAGMENT_HEADER..len].copy_from_slice(data);
        let posted = {
            let mut qp = self.qp.lock();
            let mut guard = qp.start_post_send();
            let wr = guard
                .construct_wr((WR_SEND << KIND_SHIFT) | idx as u64, WorkRequestFlags::Signaled)
                .setup_send();
            // SAFETY: the buffer is parked in its slot below before anything can complete
            // it, and stays there (not reused) until its completion returns the slot.
            unsafe { wr.setup_sge(buf.mr.lkey(), buf.addr(), len as u32) };
            let mut s = self.send.lock();
            let r = guard.post().map_err(|e| RdmaError::Post(e.to_string()));
            s.0[idx] = Some(buf);
            if r.is_err() {
                s.1.push(idx);
            }
            r
        };
        match posted {
            Ok(()) => {
                // The permit comes back with the completion.
                permit.forget();
                Ok(())
            }
            Err(e) => {
                self.fail(e.clone());
                Err(e)
            }
        }
    }

    /// Delivers every completion waiting in the queue; returns whole messages.
    fn drain(&self, reasm: &mut Reassembler, messages: &mut Vec<(u64, Bytes)>) {
        loop {
            let Ok(poller) = self.cq.start_poll() else { return };
            let mut any = false;
            for wc in poller {
                any = true;
                let status = WorkCompletionStatus::from(wc.status());
                let wr = wc.wr_id();
                let (kind, n) = (wr >> KIND_SHIFT, wr & ((1 << KIND_SHIFT) - 1));
                let failure = (status != WorkCompletionStatus::Success).then(|| RdmaError::Completion {
                    status: format!("{status:?}"),
                    vendor_err: wc.vendor_err(),
                });
                if failure.is_none() {
                    *self.last_ok.lock() = Instant::now();
                }
                match kind {
                    WR_READ => {
                        let tx = self.reads.lock().remove(&n);
                        if let Some(e) = &failure {
                            self.fail(e.clone());
                        }
                        if let Some(tx) = tx {
                            let _ = tx.send(failure.map_or(Ok(()), Err));
                        }
                    }
                    WR_SEND => {
                        self.send.lock().1.push(n as usize);
                        self.send_permits.add_permits(1);
                        if let Some(e) = failure {
                            self.fail(e);
                        }
                    }
                    WR_RECV => {
                        if let Some(e) = failure {
                            // Flushed (or failed): the queue pair is in error.
                            self.fail(e);
                            continue;
                        }
                        let i = n as usize;
                        let Some(buf) = self.recv.get(i) else { continue };
                        let len = (wc.byte_len() as usize).min(buf.mem.len());
                        let got = reasm.push(&buf.mem[..len]);
                        // The bytes are copied out: the buffer can take the next fragment.
                        let reposted = {
                            let mut qp = self.qp.lock();
                            post_recv(&mut qp, i, buf)
                        };
                        if let Err(e) = reposted {
                            self.fail(e);
                            continue;
                        }
                        match got {
                            Ok(Piece::Complete(id, msg)) => messages.push((id, msg)),
                            Ok(Piece::Partial | Piece::Noop) => {}
                            Ok(Piece::Close) => self.fail(RdmaError::Post("the peer closed the queue pair".into())),
                            Err(e) => {
                                warn!(error = %e, "malformed RDMA message; closing the queue pair");
                                self.close();
                            }
                        }
                    }
                    _ => {}
                }
            }
            if !any {
                return;
            }
        }
    }
}

fn post_recv(qp: &mut BasicQueuePair, i: usize, b: &Buffer) -> Result<(), RdmaError> {
    let mut guard = qp.start_post_recv();
    let wr = guard.construct_wr((WR_RECV << KIND_SHIFT) | i as u64);
    // SAFETY: receive buffers live as long as the endpoint (they are dropped after the
    // queue pair, which is destroyed first as the field order of `Endpoint` has it), and
    // are read only after their completion, before being posted again.
    unsafe { wr.setup_sge(b.mr.lkey(), b.addr(), b.mem.len() as u32) };
    guard.post().map_err(|e| RdmaError::Post(format!("post receive: {e}")))
}

/// Waits for completion events and delivers completions, while the endpoint lives.
async fn completions(ep: Weak<Endpoint>, fd: AsyncFd<ChannelFd>) {
    let mut reasm = match ep.upgrade() {
        Some(e) => Reassembler::new(e.max_message, MAX_PARTIAL),
        None => return,
    };
    let mut messages = Vec::new();
    loop {
        let Some(e) = ep.upgrade() else { return };
        e.drain(&mut reasm, &mut messages);
        // SAFETY: the CQ outlives this call (held by `e`).
        let armed = unsafe { rdma_mummy_sys::ibv_req_notify_cq(e.cq.cq().as_ptr(), 0) };
        if armed != 0 {
            warn!(
                error = armed,
                "cannot arm the RDMA completion queue; the queue pair is abandoned"
            );
            e.fail(RdmaError::Post("cannot arm the completion queue".into()));
            return;
        }
        // Completions that arrived before arming raise no event: drain once more.
        e.drain(&mut reasm, &mut messages);
        for (id, msg) in messages.drain(..) {
            (e.on_message)(&e, id, msg);
        }
        drop(e);
        let Ok(mut guard) = fd.readable().await else { return };
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: the channel is valid (owned by `fd`); non-blocking, so this returns
            // -1 with EAGAIN when no event is waiting.
            let got =
                unsafe { rdma_mummy_sys::ibv_get_cq_event(fd.get_ref().0.comp_channel().as_ptr(), &mut cq, &mut ctx) };
            if got != 0 {
                break;
            }
            // SAFETY: `cq` was returned by ibv_get_cq_event for our CQ.
            unsafe { rdma_mummy_sys::ibv_ack_cq_events(cq, 1) };
        }
        guard.clear_ready();
    }
}
