//! The transport conformance suite over real loopback TCP sockets.

shingle_transport::conformance_tests!(shingle_transport::conformance::Tcp);
