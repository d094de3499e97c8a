//! The transport conformance suite with remote reads over one-sided RDMA READ (soft-RoCE
//! in the guest rig: `fabric-tests/run.sh rdma`). Without an RDMA device every case
//! prints SKIP, or fails when `REQUIRE_RDMA=1`.
#![cfg(feature = "rdma")]

shingle_transport::conformance_tests!(shingle_transport::conformance::Rdma);
