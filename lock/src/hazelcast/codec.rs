//! The messages payonce sends a Hazelcast member and the answers it reads, each as the
//! protocol's definitions give it (`protocol-definitions/*.yaml` of
//! hazelcast-client-protocol): a message type `0x00SSMM00` (service `SS`, method `MM`;
//! the answer is the same plus one), fixed-size parameters in the order listed, then the
//! variable-size ones in theirs. The services: Client (0), FencedLock (7), AtomicLong (9),
//! AtomicRef (10), CPGroup (30), CPSession (31).

use super::frame::{Malformed, Message, Request, Uuid};

/// Requests that no partition owns run on whichever member receives them.
const ANY_PARTITION: i32 = -1;

/// Builds a message type from its service and method.
const fn request_type(service: u32, method: u32) -> u32 {
    (service << 16) | (method << 8)
}

pub(crate) const AUTHENTICATION: u32 = request_type(0, 1);
pub(crate) const PING: u32 = request_type(0, 11);
pub(crate) const TRY_LOCK: u32 = request_type(7, 2);
pub(crate) const UNLOCK: u32 = request_type(7, 3);
pub(crate) const LOCK_OWNERSHIP: u32 = request_type(7, 4);
pub(crate) const ATOMIC_LONG_COMPARE_AND_SET: u32 = request_type(9, 4);
pub(crate) const ATOMIC_LONG_GET: u32 = request_type(9, 5);
pub(crate) const ATOMIC_REF_COMPARE_AND_SET: u32 = request_type(10, 2);
pub(crate) const ATOMIC_REF_GET: u32 = request_type(10, 4);
pub(crate) const ATOMIC_REF_SET: u32 = request_type(10, 5);
pub(crate) const CREATE_CP_GROUP: u32 = request_type(30, 1);
pub(crate) const CREATE_SESSION: u32 = request_type(31, 1);
pub(crate) const CLOSE_SESSION: u32 = request_type(31, 2);
pub(crate) const HEARTBEAT_SESSION: u32 = request_type(31, 3);

/// The message type of every error answer.
pub(crate) const ERROR: u32 = 0;

/// A CP group's id, as the CP Subsystem names its Raft groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RaftGroupId {
    pub(crate) name: String,
    pub(crate) seed: i64,
    pub(crate) id: i64,
}

impl Request {
    /// The custom type `RaftGroupId`: fixed `seed`, `id`; then `name`.
    fn group(self, group: &RaftGroupId) -> Self {
        let mut fixed = Vec::with_capacity(16);
        fixed.extend_from_slice(&group.seed.to_le_bytes());
        fixed.extend_from_slice(&group.id.to_le_bytes());
        self.custom(&fixed, |request| request.string(&group.name))
    }
}

/// What a member answered to `Client.authentication`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Authenticated {
    /// 0 authenticated; 1 credentials (the cluster name) refused; 2 serialization version
    /// mismatch; 3 not allowed in the cluster.
    pub(crate) status: u8,
    /// The cluster's id: it changes when every member restarted (and the CP state with it).
    pub(crate) cluster: Option<Uuid>,
    pub(crate) server_version: String,
}

/// `Client.authentication`, as a client without credentials (a cluster name only), one
/// connection at a time ("unisocket", routing mode 0).
pub(crate) fn authentication(cluster_name: &str, client: Uuid, client_name: &str) -> Request {
    Request::new(AUTHENTICATION, ANY_PARTITION)
        .uuid(Some(client))
        // serializationVersion
        .byte(1)
        // routingMode (protocol 2.8; members before it skip the byte)
        .byte(0)
        // cpDirectToLeaderRouting (2.8)
        .boolean(false)
        .string(cluster_name)
        // username, password
        .null()
        .null()
        // clientType
        .string("RST")
        // clientHazelcastVersion: the protocol level this client speaks
        .string("5.4.0")
        .string(client_name)
        // labels
        .strings(&[])
}

/// Decodes `Client.authentication`'s answer: fixed `status`, `memberUuid`,
/// `serializationVersion`, `partitionCount`, `clusterId`, …; then `address` (nullable
/// `Address`), `serverHazelcastVersion`, ….
pub(crate) fn authenticated(message: &Message) -> Result<Authenticated, Malformed> {
    let mut reader = message.response();
    let status = reader.byte()?;
    let _member = reader.uuid()?;
    let _serialization = reader.byte()?;
    let _partitions = reader.int()?;
    let cluster = reader.uuid()?;
    reader.skip_nullable_structure()?;
    let server_version = reader.string().unwrap_or_default();
    Ok(Authenticated {
        status,
        cluster,
        server_version,
    })
}

/// `Client.ping`: keeps an idle connection from being closed by the member.
pub(crate) fn ping() -> Request {
    Request::new(PING, ANY_PARTITION)
}

/// `CPGroup.createCPGroup`: the id of the CP group `name` (created on first use).
pub(crate) fn create_cp_group(name: &str) -> Request {
    Request::new(CREATE_CP_GROUP, ANY_PARTITION).string(name)
}

/// Decodes the `RaftGroupId` an answer carries as its one parameter.
pub(crate) fn group_id(message: &Message) -> Result<RaftGroupId, Malformed> {
    let mut reader = message.response();
    let mut inner = reader.enter()?;
    let seed = inner.long()?;
    let id = inner.long()?;
    let name = inner.string()?;
    reader.leave(inner)?;
    Ok(RaftGroupId { name, seed, id })
}

/// A CP session as `CPSession.createSession` grants it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SessionGrant {
    pub(crate) id: i64,
    /// How long after the last heartbeat the group ends the session.
    pub(crate) ttl_millis: i64,
    /// How often the client must heartbeat.
    pub(crate) heartbeat_millis: i64,
}

/// `CPSession.createSession` for the endpoint `endpoint_name`.
pub(crate) fn create_session(group: &RaftGroupId, endpoint_name: &str) -> Request {
    Request::new(CREATE_SESSION, ANY_PARTITION)
        .group(group)
        .string(endpoint_name)
}

pub(crate) fn session_granted(message: &Message) -> Result<SessionGrant, Malformed> {
    let mut reader = message.response();
    Ok(SessionGrant {
        id: reader.long()?,
        ttl_millis: reader.long()?,
        heartbeat_millis: reader.long()?,
    })
}

/// `CPSession.heartbeatSession`.
pub(crate) fn heartbeat_session(group: &RaftGroupId, session: i64) -> Request {
    Request::new(HEARTBEAT_SESSION, ANY_PARTITION)
        .long(session)
        .group(group)
}

/// `CPSession.closeSession`: ends the session, freeing its locks at once.
pub(crate) fn close_session(group: &RaftGroupId, session: i64) -> Request {
    Request::new(CLOSE_SESSION, ANY_PARTITION)
        .long(session)
        .group(group)
}

/// Who holds (or asks for) a FencedLock: a CP session and a thread of it. Each grant
/// payonce asks for is a thread of its own, so two acquires never re-enter each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Endpoint {
    pub(crate) session: i64,
    pub(crate) thread: i64,
}

/// `FencedLock.tryLock`: waits up to `timeout_ms` (0: not at all) in the lock's queue.
/// The answer is the fence, or a non-positive number when not granted.
pub(crate) fn try_lock(
    group: &RaftGroupId,
    name: &str,
    holder: Endpoint,
    invocation: Uuid,
    timeout_ms: i64,
) -> Request {
    Request::new(TRY_LOCK, ANY_PARTITION)
        .long(holder.session)
        .long(holder.thread)
        .uuid(Some(invocation))
        .long(timeout_ms)
        .group(group)
        .string(name)
}

/// `FencedLock.unlock`. The answer says whether the endpoint still holds it (re-entered).
pub(crate) fn unlock(
    group: &RaftGroupId,
    name: &str,
    holder: Endpoint,
    invocation: Uuid,
) -> Request {
    Request::new(UNLOCK, ANY_PARTITION)
        .long(holder.session)
        .long(holder.thread)
        .uuid(Some(invocation))
        .group(group)
        .string(name)
}

/// `FencedLock.getLockOwnership`.
pub(crate) fn lock_ownership(group: &RaftGroupId, name: &str) -> Request {
    Request::new(LOCK_OWNERSHIP, ANY_PARTITION)
        .group(group)
        .string(name)
}

/// Who holds a FencedLock, as `getLockOwnership` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ownership {
    pub(crate) fence: i64,
    /// Holds of the holder (re-entries count): 0 when free.
    pub(crate) lock_count: i32,
    pub(crate) holder: Endpoint,
}

pub(crate) fn ownership(message: &Message) -> Result<Ownership, Malformed> {
    let mut reader = message.response();
    let fence = reader.long()?;
    let lock_count = reader.int()?;
    let session = reader.long()?;
    let thread = reader.long()?;
    Ok(Ownership {
        fence,
        lock_count,
        holder: Endpoint { session, thread },
    })
}

/// `AtomicLong.get`.
pub(crate) fn atomic_long_get(group: &RaftGroupId, name: &str) -> Request {
    Request::new(ATOMIC_LONG_GET, ANY_PARTITION)
        .group(group)
        .string(name)
}

/// `AtomicLong.compareAndSet`.
pub(crate) fn atomic_long_compare_and_set(
    group: &RaftGroupId,
    name: &str,
    expected: i64,
    updated: i64,
) -> Request {
    Request::new(ATOMIC_LONG_COMPARE_AND_SET, ANY_PARTITION)
        .long(expected)
        .long(updated)
        .group(group)
        .string(name)
}

/// `AtomicRef.get`.
pub(crate) fn atomic_ref_get(group: &RaftGroupId, name: &str) -> Request {
    Request::new(ATOMIC_REF_GET, ANY_PARTITION)
        .group(group)
        .string(name)
}

/// `AtomicRef.set`, answering the value it replaced.
pub(crate) fn atomic_ref_get_and_set(
    group: &RaftGroupId,
    name: &str,
    value: Option<&[u8]>,
) -> Request {
    Request::new(ATOMIC_REF_SET, ANY_PARTITION)
        // returnOldValue
        .boolean(true)
        .group(group)
        .string(name)
        .data(value)
}

/// `AtomicRef.compareAndSet`.
pub(crate) fn atomic_ref_compare_and_set(
    group: &RaftGroupId,
    name: &str,
    expected: Option<&[u8]>,
    updated: Option<&[u8]>,
) -> Request {
    Request::new(ATOMIC_REF_COMPARE_AND_SET, ANY_PARTITION)
        .group(group)
        .string(name)
        .data(expected)
        .data(updated)
}

/// An answer whose one parameter is a `long`.
pub(crate) fn long_answer(message: &Message) -> Result<i64, Malformed> {
    message.response().long()
}

/// An answer whose one parameter is a `boolean`.
pub(crate) fn boolean_answer(message: &Message) -> Result<bool, Malformed> {
    message.response().boolean()
}

/// An answer whose one parameter is a nullable `Data`.
pub(crate) fn data_answer(message: &Message) -> Result<Option<Vec<u8>>, Malformed> {
    message.response().nullable_data()
}

/// The first error of an error answer (`ErrorHolder`: fixed `errorCode`; then
/// `className`, nullable `message`, the stack trace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerError {
    pub(crate) code: i32,
    pub(crate) class_name: String,
    pub(crate) message: Option<String>,
}

pub(crate) fn server_error(message: &Message) -> Result<ServerError, Malformed> {
    let mut reader = message.response();
    let mut list = reader.begin_list()?;
    if list.at_end() {
        return Err(Malformed("an error answer without an error".to_owned()));
    }
    let mut holder = list.enter()?;
    let code = holder.int()?;
    let class_name = holder.string()?;
    let text = holder.nullable_string()?;
    list.leave(holder)?;
    Ok(ServerError {
        code,
        class_name,
        message: text,
    })
}

/// The error codes payonce tells apart (the protocol's error code table).
pub(crate) mod error_code {
    pub(crate) const ILLEGAL_MONITOR_STATE: i32 = 26;
    pub(crate) const SESSION_EXPIRED: i32 = 85;
    pub(crate) const WAIT_KEY_CANCELLED: i32 = 86;
    pub(crate) const LOCK_OWNERSHIP_LOST: i32 = 88;
    pub(crate) const CP_GROUP_DESTROYED: i32 = 89;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes as the protocol document prints them: hex pairs, comments after `//`.
    fn bytes(listing: &str) -> Vec<u8> {
        listing
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .flat_map(str::split_whitespace)
            .map(|byte| u8::from_str_radix(byte.trim_start_matches("0x"), 16).unwrap())
            .collect()
    }

    /// The protocol document's own example (§5.3.3, "Fenced Lock Example"): the request of
    /// `FencedLock.lock` with session 123, thread 96, invocation UUID(123456789,
    /// 987654321), on group ("raft-group", seed 54, id 64), lock "lock", correlation id
    /// 7, partition 0x11 — encoded here byte for byte as the document lists it.
    #[test]
    fn a_lock_request_is_the_documents_bytes() {
        let expected = bytes(
            "0x37 0x00 0x00 0x00 // Frame length
             0x00 0xc0 // Flags
             0x00 0x01 0x07 0x00 // Message type
             0x07 0x00 0x00 0x00 0x00 0x00 0x00 0x00 // Correlation ID
             0x11 0x00 0x00 0x00 // Partition ID
             0x7b 0x00 0x00 0x00 0x00 0x00 0x00 0x00 // Session ID: 123
             0x60 0x00 0x00 0x00 0x00 0x00 0x00 0x00 // Thread ID: 96
             0x00 0x15 0xcd 0x5b 0x07 0x00 0x00 0x00 0x00 0xb1 0x68 0xde 0x3a 0x00 0x00 0x00 0x00
             0x06 0x00 0x00 0x00 0x00 0x10 // BEGIN of the RaftGroupId
             0x16 0x00 0x00 0x00 0x00 0x00
             0x36 0x00 0x00 0x00 0x00 0x00 0x00 0x00 // Seed: 54
             0x40 0x00 0x00 0x00 0x00 0x00 0x00 0x00 // Id: 64
             0x10 0x00 0x00 0x00 0x00 0x00
             0x72 0x61 0x66 0x74 0x2d 0x67 0x72 0x6f 0x75 0x70 // raft-group
             0x06 0x00 0x00 0x00 0x00 0x08 // END of the RaftGroupId
             0x0a 0x00 0x00 0x00 0x00 0x20 // the final frame
             0x6c 0x6f 0x63 0x6b // lock",
        );
        let group = RaftGroupId {
            name: "raft-group".to_owned(),
            seed: 54,
            id: 64,
        };
        // FencedLock.lock (method 1): tryLock's parameters without the timeout.
        let request = Request::new(request_type(7, 1), 0x11)
            .long(123)
            .long(96)
            .uuid(Some((123_456_789, 987_654_321)))
            .group(&group)
            .string("lock");
        assert_eq!(request.encode(7), expected);
    }

    /// The document's answer to it: fence 12345678.
    #[test]
    fn a_lock_answer_is_read_from_the_documents_bytes() {
        let answer = Message::decode(&bytes(
            "0x1b 0x00 0x00 0x00 0x00 0xe0
             0x01 0x01 0x07 0x00 // Message type
             0x07 0x00 0x00 0x00 0x00 0x00 0x00 0x00 // Correlation ID
             0x00 // Backup acks count
             0x4e 0x61 0xbc 0x00 0x00 0x00 0x00 0x00 // Fence token: 12345678",
        ))
        .unwrap();
        assert_eq!(answer.message_type(), request_type(7, 1) + 1);
        assert_eq!(answer.correlation(), 7);
        assert_eq!(long_answer(&answer).unwrap(), 12_345_678);
    }

    /// The document's `Client.createProxy` example (§5.3.1): two strings after a first
    /// frame with no parameters, the second flagged final.
    #[test]
    fn a_create_proxy_request_is_the_documents_bytes() {
        let expected = bytes(
            "0x16 0x00 0x00 0x00 0x00 0xc0
             0x00 0x04 0x00 0x00
             0x30 0x00 0x00 0x00 0x00 0x00 0x00 0x00
             0xff 0xff 0xff 0xff
             0x0e 0x00 0x00 0x00 0x00 0x00
             0x6d 0x61 0x70 0x2d 0x6e 0x61 0x6d 0x65
             0x18 0x00 0x00 0x00 0x00 0x20
             0x68 0x7a 0x3a 0x69 0x6d 0x70 0x6c 0x3a 0x6d 0x61 0x70 0x53 0x65 0x72 0x76 0x69 0x63 0x65",
        );
        let request = Request::new(request_type(0, 4), -1)
            .string("map-name")
            .string("hz:impl:mapService");
        assert_eq!(request.encode(0x30), expected);
    }

    /// A request with no variable-size parameter flags its first frame final.
    #[test]
    fn a_ping_is_one_final_frame() {
        let encoded = ping().encode(1);
        assert_eq!(encoded.len(), 6 + 16);
        assert_eq!(&encoded[..6], &[22, 0, 0, 0, 0x00, 0xe0]);
        assert_eq!(&encoded[6..10], &PING.to_le_bytes());
    }

    /// A `RaftGroupId` answer reads the same whether its fixed fields come in a frame of
    /// their own (as the document shows requests) or in the BEGIN frame itself (which the
    /// grammar allows), and fields a newer member adds are skipped up to the END frame.
    #[test]
    fn a_group_id_is_read_in_either_layout_and_past_new_fields() {
        let header = bytes("0x01 0x01 0x1e 0x00 0x05 0 0 0 0 0 0 0 0x00");
        let mut fixed = 54_i64.to_le_bytes().to_vec();
        fixed.extend_from_slice(&64_i64.to_le_bytes());
        let frame = |flags: u16, payload: &[u8]| super::super::frame::Frame {
            flags,
            payload: payload.to_vec(),
        };
        use super::super::frame::{BEGIN_DATA_STRUCTURE, END_DATA_STRUCTURE, IS_FINAL};
        let separate = vec![
            frame(0xc000, &header),
            frame(BEGIN_DATA_STRUCTURE, &[]),
            frame(0, &fixed),
            frame(0, b"default"),
            frame(0, b"a field from a later version"),
            frame(END_DATA_STRUCTURE | IS_FINAL, &[]),
        ];
        let piggybacked = vec![
            frame(0xc000, &header),
            frame(BEGIN_DATA_STRUCTURE, &fixed),
            frame(0, b"default"),
            frame(END_DATA_STRUCTURE | IS_FINAL, &[]),
        ];
        for frames in [separate, piggybacked] {
            let message = Message::new(frames).unwrap();
            assert_eq!(
                group_id(&message).unwrap(),
                RaftGroupId {
                    name: "default".to_owned(),
                    seed: 54,
                    id: 64
                }
            );
        }
    }

    /// An error answer: a list of `ErrorHolder`s, the first read (code, class, message),
    /// its stack trace skipped.
    #[test]
    fn an_error_answer_gives_its_first_error() {
        use super::super::frame::{BEGIN_DATA_STRUCTURE, END_DATA_STRUCTURE, Frame, IS_FINAL};
        let frame = |flags: u16, payload: &[u8]| Frame {
            flags,
            payload: payload.to_vec(),
        };
        let header = bytes("0 0 0 0 0x09 0 0 0 0 0 0 0 0x00");
        let message = Message::new(vec![
            frame(0xc000, &header),
            frame(BEGIN_DATA_STRUCTURE, &[]),
            frame(BEGIN_DATA_STRUCTURE, &[]),
            frame(0, &85_i32.to_le_bytes()),
            frame(
                0,
                b"com.hazelcast.cp.internal.session.SessionExpiredException",
            ),
            frame(0, b"Session: 7 is expired"),
            frame(BEGIN_DATA_STRUCTURE, &[]),
            frame(BEGIN_DATA_STRUCTURE, &[]),
            frame(0, &12_i32.to_le_bytes()),
            frame(0, b"Foo"),
            frame(0, b"bar"),
            frame(0, b"Foo.java"),
            frame(END_DATA_STRUCTURE, &[]),
            frame(END_DATA_STRUCTURE, &[]),
            frame(END_DATA_STRUCTURE, &[]),
            frame(END_DATA_STRUCTURE | IS_FINAL, &[]),
        ])
        .unwrap();
        assert_eq!(message.message_type(), ERROR);
        let error = server_error(&message).unwrap();
        assert_eq!(error.code, error_code::SESSION_EXPIRED);
        assert!(error.class_name.ends_with("SessionExpiredException"));
        assert_eq!(error.message.as_deref(), Some("Session: 7 is expired"));
    }

    /// `tryLock` puts its four fixed parameters in the definition's order (session, thread,
    /// invocation, timeout) and its group before its name.
    #[test]
    fn a_try_lock_request_lists_its_parameters_in_order() {
        let group = RaftGroupId {
            name: "default".to_owned(),
            seed: 0,
            id: 1,
        };
        let holder = Endpoint {
            session: 5,
            thread: 9,
        };
        let encoded = try_lock(&group, "payonce:k", holder, (1, 2), 250).encode(3);
        let message = Message::decode(&encoded).unwrap();
        assert_eq!(message.message_type(), TRY_LOCK);
        assert_eq!(message.correlation(), 3);
        // First frame: 6 header + 16 request header + 8 + 8 + 17 + 8.
        assert_eq!(
            u32::from_le_bytes(encoded[..4].try_into().unwrap()),
            6 + 16 + 41
        );
        let fixed = &encoded[6 + 16..6 + 16 + 41];
        assert_eq!(&fixed[..8], &5_i64.to_le_bytes());
        assert_eq!(&fixed[8..16], &9_i64.to_le_bytes());
        assert_eq!(fixed[16], 0, "a UUID that is not null");
        assert_eq!(&fixed[17..25], &1_u64.to_le_bytes());
        assert_eq!(&fixed[25..33], &2_u64.to_le_bytes());
        assert_eq!(&fixed[33..41], &250_i64.to_le_bytes());
        assert!(encoded.ends_with(b"payonce:k"));
    }

    /// A stream that breaks a frame's length or fragments a message is refused, not read.
    #[test]
    fn broken_streams_are_refused() {
        let mut too_long = ping().encode(1);
        too_long[..4].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(Message::decode(&too_long).is_err());
        let mut too_short = ping().encode(1);
        too_short[..4].copy_from_slice(&5_i32.to_le_bytes());
        assert!(Message::decode(&too_short).is_err());
        let mut fragment = ping().encode(1);
        fragment[5] = 0x80 | 0x20;
        assert!(Message::decode(&fragment).is_err());
        let truncated = ping().encode(1);
        assert!(Message::decode(&truncated[..truncated.len() - 1]).is_err());
    }
}
