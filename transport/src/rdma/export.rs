//! The server's RDMA side: queue pairs for clients (RPCs over SEND/RECV, one-sided READs
//! of registered regions) and region-key resolution.

use super::endpoint::Endpoint;
use super::{Device, NewQp, QpInfo, RDMA_CONNECT, RDMA_RESOLVE, ResolveRequest, Resolved};
use crate::TransportConfig;
use crate::auth::Principal;
use crate::frame::{Frame, MsgKind, decode_frame};
use crate::region::{RegionKey, RegionTable};
use crate::server::{CallContext, Router};
use crate::status::{Code, Status};
use bytes::Bytes;
use parking_lot::Mutex;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::CompletionChannel;
use sideway::ibverbs::memory_region::MemoryRegion;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tracing::{Instrument, debug, info_span, warn};

/// Queue pairs a server keeps at most (the oldest are closed first).
const MAX_SERVER_QPS: usize = 4096;

/// A server's RDMA side: accepts queue pairs and resolves region keys.
pub struct RdmaExport {
    dev: Arc<Device>,
    regions: Arc<RegionTable>,
    /// The service handlers RPCs over RDMA are dispatched to.
    router: Mutex<Option<Router>>,
    max_frame: u32,
    /// RPCs handled at once per queue pair (the TCP server's per-connection bound).
    per_qp: usize,
    state: Mutex<ExportState>,
    /// RPCs being handled; a graceful shutdown waits for them.
    inflight: AtomicUsize,
    closing: AtomicBool,
}

#[derive(Default)]
struct ExportState {
    /// Registered regions by (slot, generation), with the bytes they pin.
    mrs: HashMap<(u32, u32), (Arc<MemoryRegion>, Bytes)>,
    /// Queue pairs by client session, oldest first in `order`.
    qps: HashMap<u64, (Arc<Endpoint>, Arc<Semaphore>)>,
    order: VecDeque<u64>,
}

impl Drop for RdmaExport {
    fn drop(&mut self) {
        for (ep, _) in self.lock().qps.values() {
            ep.close();
        }
    }
}

impl RdmaExport {
    /// Serves `regions` over `dev`, with the frame and in-flight limits of `config` (the
    /// server's). Revoking a region deregisters its memory.
    pub fn new(dev: Arc<Device>, regions: Arc<RegionTable>, config: &TransportConfig) -> Arc<RdmaExport> {
        let export = Arc::new(RdmaExport {
            dev,
            regions: regions.clone(),
            router: Mutex::new(None),
            max_frame: config.max_frame_bytes,
            per_qp: config.max_inflight_requests as usize,
            state: Mutex::new(ExportState::default()),
            inflight: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
        });
        let weak: Weak<RdmaExport> = Arc::downgrade(&export);
        regions.on_revoke(Box::new(move |key| {
            if let Some(e) = weak.upgrade() {
                e.lock().mrs.remove(&(key.region, key.generation));
            }
        }));
        export
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, ExportState> {
        self.state.lock()
    }

    /// The device served.
    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// Queue pairs open now.
    pub fn queue_pairs(&self) -> usize {
        self.lock().qps.len()
    }

    /// Adds the handshake and resolve handlers to `router`; RPCs arriving over RDMA are
    /// dispatched to `router`'s handlers. A graceful server shutdown waits for RPCs in
    /// flight over RDMA, then closes every queue pair.
    pub fn routes(self: &Arc<Self>, router: Router) -> Router {
        *self.router.lock() = Some(router.clone());
        let e = self.clone();
        let router = router.transport_raw(RDMA_CONNECT, move |ctx: CallContext, payload: Bytes| {
            let e = e.clone();
            async move {
                let req: QpInfo = decode(&payload)?;
                let reply = e.accept(ctx.peer, ctx.principal.clone(), &req)?;
                Ok(Bytes::from(prost::Message::encode_to_vec(&reply)))
            }
        });
        let e = self.clone();
        let router = router.transport_raw(RDMA_RESOLVE, move |_: CallContext, payload: Bytes| {
            let e = e.clone();
            async move {
                let req: ResolveRequest = decode(&payload)?;
                let reply = e.resolve(&req)?;
                Ok(Bytes::from(prost::Message::encode_to_vec(&reply)))
            }
        });
        let e = self.clone();
        router.on_shutdown(Arc::new(move |grace| {
            let e = e.clone();
            Box::pin(async move { e.shutdown(grace).await })
        }))
    }

    /// Refuses new RPCs, waits up to `grace` for those in flight, closes every queue pair.
    pub async fn shutdown(&self, grace: Duration) {
        self.closing.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + grace;
        while self.inflight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let qps: Vec<Arc<Endpoint>> = {
            let mut st = self.lock();
            st.order.clear();
            st.qps.drain().map(|(_, (q, _))| q).collect()
        };
        // Replies already posted, then a close notice, go out before the queue pairs close.
        let goodbyes: Vec<_> = qps
            .iter()
            .map(|q| {
                let q = q.clone();
                tokio::spawn(async move { q.say_goodbye().await })
            })
            .collect();
        for g in goodbyes {
            let _ = g.await;
        }
        for q in qps {
            q.close();
        }
    }

    fn accept(
        self: &Arc<Self>,
        peer: SocketAddr,
        principal: Arc<Principal>,
        remote: &QpInfo,
    ) -> Result<QpInfo, Status> {
        if self.closing.load(Ordering::Relaxed) {
            return Err(Status::new(Code::ShuttingDown, "the server is shutting down"));
        }
        let fail = |why: String| Status::new(Code::Internal, format!("RDMA queue pair for {peer}: {why}"));
        let channel = CompletionChannel::new(&self.dev.ctx).map_err(|e| fail(e.to_string()))?;
        let NewQp { mut qp, cq, psn } = self
            .dev
            .new_qp(Some(&channel), AccessFlags::RemoteRead | AccessFlags::LocalWrite)
            .map_err(fail)?;
        self.dev.connect_qp(&mut qp, psn, remote).map_err(fail)?;
        let info = self.dev.info(&qp, psn, remote.session);
        let weak = Arc::downgrade(self);
        let max_message = self.max_frame as usize + crate::frame::HEADER_LEN;
        let ep = Endpoint::start(
            self.dev.clone(),
            qp,
            cq,
            channel,
            max_message,
            Box::new(move |ep, id, msg| {
                if let Some(e) = weak.upgrade() {
                    e.on_message(peer, &principal, ep, id, msg);
                }
            }),
        )
        .map_err(|e| fail(e.to_string()))?;
        let mut st = self.lock();
        // Queue pairs of clients that went away (their replies failed) are dropped.
        st.qps.retain(|_, (q, _)| !q.is_broken());
        let ExportState { qps, order, .. } = &mut *st;
        order.retain(|s| qps.contains_key(s));
        if let Some((old, _)) = st
            .qps
            .insert(remote.session, (ep, Arc::new(Semaphore::new(self.per_qp))))
        {
            old.close();
        } else {
            st.order.push_back(remote.session);
        }
        while st.qps.len() > MAX_SERVER_QPS {
            let Some(old) = st.order.pop_front() else { break };
            if let Some((q, _)) = st.qps.remove(&old) {
                q.close();
            }
        }
        debug!(%peer, qpn = info.qpn, remote_qpn = remote.qpn, "RDMA queue pair ready");
        Ok(info)
    }

    /// A whole message from a client: a request frame, handled in a task of its own.
    fn on_message(
        self: Arc<Self>,
        peer: SocketAddr,
        principal: &Arc<Principal>,
        ep: &Arc<Endpoint>,
        id: u64,
        msg: Bytes,
    ) {
        let frame = match decode_frame(&msg, self.max_frame) {
            Ok((f, used)) if used == msg.len() && !f.header.is_response() => f,
            Ok(_) => {
                warn!(%peer, "RDMA message is not one request frame; closing the queue pair");
                ep.close();
                return;
            }
            Err(e) => {
                warn!(%peer, error = %e, "malformed frame over RDMA; closing the queue pair");
                ep.close();
                return;
            }
        };
        let ep = ep.clone();
        let permits = self
            .lock()
            .qps
            .values()
            .find(|(q, _)| Arc::ptr_eq(q, &ep))
            .map(|(_, p)| p.clone());
        self.inflight.fetch_add(1, Ordering::Relaxed);
        let router = self.router.lock().clone();
        let closing = self.closing.load(Ordering::Relaxed);
        let header = frame.header;
        let principal = principal.clone();
        let span = info_span!("rpc.server", otel.kind = "server", rpc.kind = %header.kind, %peer, fabric = "rdma", bytes_in = frame.payload.len());
        crate::trace::adopt(&span, &header.trace);
        tokio::spawn(
            async move {
                // The per-queue-pair bound, like the TCP server's per connection.
                let _permit = match &permits {
                    Some(p) => p.clone().acquire_owned().await.ok(),
                    None => None,
                };
                let deadline = (header.timeout_ms > 0).then(|| Duration::from_millis(u64::from(header.timeout_ms)));
                let result = match (header.kind, router) {
                    _ if closing => Err(Status::new(Code::ShuttingDown, "the server is shutting down")),
                    (MsgKind::PING, _) => Ok(frame.payload),
                    (kind, Some(r)) => {
                        crate::server::dispatch(&r, peer, &principal, kind, deadline, frame.payload).await
                    }
                    (kind, None) => Err(Status::new(Code::UnknownKind, format!("no handler for {kind}"))),
                };
                let reply = match result {
                    Ok(b) if b.len() <= self.max_frame as usize => Frame {
                        header: header.response(false),
                        payload: b,
                    },
                    Ok(b) => error_frame(
                        &header,
                        Status::new(
                            Code::Internal,
                            format!("reply of {} bytes exceeds the frame limit", b.len()),
                        ),
                    ),
                    Err(s) => error_frame(&header, s),
                };
                match reply.encode() {
                    Ok(bytes) => {
                        if let Err(e) = ep.send_message(id, &bytes).await {
                            debug!(%peer, error = %e, "cannot send an RDMA reply");
                        }
                    }
                    Err(e) => warn!(error = %e, "cannot encode reply"),
                }
                self.inflight.fetch_sub(1, Ordering::Relaxed);
            }
            .instrument(span),
        );
    }

    fn resolve(&self, req: &ResolveRequest) -> Result<Resolved, Status> {
        let key = RegionKey {
            region: req.region,
            generation: req.generation,
            len: req.key_len,
        };
        let id = (key.region, key.generation);
        if let Some((mr, bytes)) = self.lock().mrs.get(&id) {
            return Ok(resolved(mr, bytes, key));
        }
        // The same checks as a TCP read: unknown or stale keys are refused.
        let bytes = self.regions.whole(key).map_err(|e| Status::from(&e))?;
        // SAFETY: `bytes` is kept with the registration (in `mrs`), so the memory stays
        // mapped for as long as the NIC may read it; remote read only.
        // A region the NIC cannot pin (a shared read-only file mapping on kernels before
        // 6.2, whose pinning asks for write access) is read over TCP: the client is told
        // so for this region and keeps RDMA for the others.
        let mr = unsafe { self.dev.register(bytes.as_ptr(), bytes.len(), AccessFlags::RemoteRead) }.map_err(|e| {
            debug!(region = key.region, error = %e, "region not registrable; its reads go over TCP");
            Status::new(
                Code::NotRegistrable,
                format!("cannot register region {}: {e}", key.region),
            )
        })?;
        let out = resolved(&mr, &bytes, key);
        self.lock().mrs.insert(id, (mr, bytes));
        // A revoke between the check and the insert must not leave it registered.
        if self.regions.access(key, 0, 0).is_err() {
            self.lock().mrs.remove(&id);
            return Err(Status::new(Code::StaleGeneration, "region revoked"));
        }
        Ok(out)
    }
}

fn error_frame(request: &crate::frame::FrameHeader, s: Status) -> Frame {
    debug!(status = %s, "request failed");
    Frame {
        header: request.response(true),
        payload: Bytes::from(s.encode_to_vec()),
    }
}

fn resolved(mr: &MemoryRegion, bytes: &Bytes, key: RegionKey) -> Resolved {
    Resolved {
        addr: bytes.as_ptr() as u64,
        rkey: mr.rkey(),
        len: (bytes.len() as u64).min(key.len),
    }
}

fn decode<M: prost::Message + Default>(b: &[u8]) -> Result<M, Status> {
    M::decode(b).map_err(|e| Status::new(Code::InvalidRequest, format!("undecodable RDMA request: {e}")))
}
