//! The transport conformance suite with remote reads over one-sided RDMA READ (soft-RoCE
//! in the guest rig: `fabric-tests/run.sh rdma`, which runs these `#[ignore]`d cases
//! with `--include-ignored`). Without an RDMA device every case fails.
#![cfg(feature = "rdma")]

shingle_transport::conformance_tests!(
    #[ignore = "needs an RDMA device: runs in the guest rig (fabric-tests/run.sh rdma)"]
    shingle_transport::conformance::Rdma
);
