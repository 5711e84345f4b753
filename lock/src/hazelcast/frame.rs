//! Hazelcast's client message, as the Open Binary Client Protocol (2.x) defines it: a
//! message is a run of frames, each `length: i32 LE` (header included), `flags: u16 LE`,
//! then its payload. The first frame carries the message type, the correlation id and
//! every fixed-size parameter; each variable-size parameter follows in frames of its own
//! (a string in one frame, a custom type or a list of variable-size items between a
//! BEGIN and an END frame, a null as one frame flagged null). The last frame is flagged
//! final. Everything is little-endian, UTF-8 for strings.
//!
//! [`Request`] builds one, [`Message`] is one read off the wire, and [`Reader`] walks its
//! frames. Only what payonce's messages use is here; the codecs are in `codec.rs`.

use std::fmt;

/// The first frame of a message that is not split into fragments has both fragment bits.
pub(crate) const BEGIN_FRAGMENT: u16 = 1 << 15;
pub(crate) const END_FRAGMENT: u16 = 1 << 14;
pub(crate) const UNFRAGMENTED: u16 = BEGIN_FRAGMENT | END_FRAGMENT;
/// The last frame of a message.
pub(crate) const IS_FINAL: u16 = 1 << 13;
/// Opens and closes a custom type or a list of variable-size items.
pub(crate) const BEGIN_DATA_STRUCTURE: u16 = 1 << 12;
pub(crate) const END_DATA_STRUCTURE: u16 = 1 << 11;
/// A variable-size parameter that is null.
pub(crate) const IS_NULL: u16 = 1 << 10;
/// The first frame of an event pushed by a member (payonce registers no listener).
pub(crate) const IS_EVENT: u16 = 1 << 9;

/// Length and flags.
pub(crate) const FRAME_HEADER: usize = 6;

/// The largest frame payonce reads: its answers are a few hundred bytes, an error's stack
/// trace a few KiB. A length past this is a broken stream, not a message.
pub(crate) const MAX_FRAME: usize = 4 << 20;

/// A request's first-frame payload before its parameters: message type, correlation id,
/// partition id.
const REQUEST_HEADER: usize = 4 + 8 + 4;
/// A response's: message type, correlation id, backup acks count.
pub(crate) const RESPONSE_HEADER: usize = 4 + 8 + 1;

/// A UUID as the protocol sends a fixed-size one: a null flag, then the most and the
/// least significant halves.
pub(crate) const UUID_SIZE: usize = 1 + 8 + 8;

/// The `(most, least)` significant halves of a UUID.
pub(crate) type Uuid = (u64, u64);

/// One frame: flags and payload.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) flags: u16,
    pub(crate) payload: Vec<u8>,
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Frame({:#06x}, {} bytes)",
            self.flags,
            self.payload.len()
        )
    }
}

impl Frame {
    fn is(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

/// A request being built: the fixed-size parameters go into the first frame in the order
/// they are added, each variable-size one into frames of its own after it — so a codec
/// adds its fixed parameters in the order the definition lists them, then its
/// variable-size ones in theirs.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    first: Vec<u8>,
    rest: Vec<Frame>,
}

impl Request {
    /// A request of `message_type` for partition `partition` (-1: any member may run it).
    pub(crate) fn new(message_type: u32, partition: i32) -> Self {
        let mut first = Vec::with_capacity(REQUEST_HEADER + 48);
        first.extend_from_slice(&message_type.to_le_bytes());
        // The correlation id is written when the request is sent.
        first.extend_from_slice(&0_i64.to_le_bytes());
        first.extend_from_slice(&partition.to_le_bytes());
        Self {
            first,
            rest: Vec::new(),
        }
    }

    /// The message type it was made with.
    pub(crate) fn message_type(&self) -> u32 {
        u32::from_le_bytes([self.first[0], self.first[1], self.first[2], self.first[3]])
    }

    pub(crate) fn byte(mut self, value: u8) -> Self {
        self.first.push(value);
        self
    }

    pub(crate) fn boolean(self, value: bool) -> Self {
        self.byte(u8::from(value))
    }

    pub(crate) fn long(mut self, value: i64) -> Self {
        self.first.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub(crate) fn uuid(mut self, value: Option<Uuid>) -> Self {
        put_uuid(&mut self.first, value);
        self
    }

    /// A string parameter, in a frame of its own.
    pub(crate) fn string(mut self, value: &str) -> Self {
        self.rest.push(Frame {
            flags: 0,
            payload: value.as_bytes().to_vec(),
        });
        self
    }

    /// A null variable-size parameter.
    pub(crate) fn null(mut self) -> Self {
        self.rest.push(Frame {
            flags: IS_NULL,
            payload: Vec::new(),
        });
        self
    }

    /// A serialized value (the protocol's `Data`), in a frame of its own; `None` is null.
    pub(crate) fn data(self, value: Option<&[u8]>) -> Self {
        match value {
            None => self.null(),
            Some(bytes) => {
                let mut request = self;
                request.rest.push(Frame {
                    flags: 0,
                    payload: bytes.to_vec(),
                });
                request
            }
        }
    }

    /// A list of strings: BEGIN, a frame per item, END.
    pub(crate) fn strings(mut self, items: &[&str]) -> Self {
        self.rest.push(begin_frame());
        for item in items {
            self = self.string(item);
        }
        self.rest.push(end_frame());
        self
    }

    /// A custom type: BEGIN, a frame of its fixed-size fields, its variable-size fields
    /// (written by `fields`), END.
    pub(crate) fn custom(mut self, fixed: &[u8], fields: impl FnOnce(Self) -> Self) -> Self {
        self.rest.push(begin_frame());
        self.rest.push(Frame {
            flags: 0,
            payload: fixed.to_vec(),
        });
        let mut request = fields(self);
        request.rest.push(end_frame());
        request
    }

    /// The message on the wire, with `correlation` as its id.
    pub(crate) fn encode(&self, correlation: i64) -> Vec<u8> {
        let size = FRAME_HEADER
            + self.first.len()
            + self
                .rest
                .iter()
                .map(|frame| FRAME_HEADER + frame.payload.len())
                .sum::<usize>();
        let mut bytes = Vec::with_capacity(size);
        let last = self.rest.len();
        let first_flags = UNFRAGMENTED | if last == 0 { IS_FINAL } else { 0 };
        put_frame(&mut bytes, first_flags, &self.first);
        bytes[FRAME_HEADER + 4..FRAME_HEADER + 12].copy_from_slice(&correlation.to_le_bytes());
        for (index, frame) in self.rest.iter().enumerate() {
            let flags = frame.flags | if index + 1 == last { IS_FINAL } else { 0 };
            put_frame(&mut bytes, flags, &frame.payload);
        }
        bytes
    }
}

fn begin_frame() -> Frame {
    Frame {
        flags: BEGIN_DATA_STRUCTURE,
        payload: Vec::new(),
    }
}

fn end_frame() -> Frame {
    Frame {
        flags: END_DATA_STRUCTURE,
        payload: Vec::new(),
    }
}

fn put_frame(bytes: &mut Vec<u8>, flags: u16, payload: &[u8]) {
    let length = i32::try_from(FRAME_HEADER + payload.len()).unwrap_or(i32::MAX);
    bytes.extend_from_slice(&length.to_le_bytes());
    bytes.extend_from_slice(&flags.to_le_bytes());
    bytes.extend_from_slice(payload);
}

pub(crate) fn put_uuid(bytes: &mut Vec<u8>, value: Option<Uuid>) {
    match value {
        None => {
            bytes.push(1);
            bytes.extend_from_slice(&[0; 16]);
        }
        Some((most, least)) => {
            bytes.push(0);
            bytes.extend_from_slice(&most.to_le_bytes());
            bytes.extend_from_slice(&least.to_le_bytes());
        }
    }
}

/// A message the stream broke off or does not follow the protocol.
#[derive(Debug, thiserror::Error)]
#[error("Hazelcast protocol: {0}")]
pub(crate) struct Malformed(pub(crate) String);

fn malformed(what: impl Into<String>) -> Malformed {
    Malformed(what.into())
}

/// Reads frames one at a time from a stream of bytes, and gathers them into messages.
#[derive(Debug, Default)]
pub(crate) struct Assembler {
    frames: Vec<Frame>,
}

impl Assembler {
    /// Takes one frame: `Some` message when it was the final one. A fragmented message
    /// is refused: members fragment only messages far larger than any payonce asks for.
    pub(crate) fn push(&mut self, frame: Frame) -> Result<Option<Message>, Malformed> {
        if self.frames.is_empty() && frame.flags & UNFRAGMENTED != UNFRAGMENTED {
            return Err(malformed("a fragmented message"));
        }
        let last = frame.is(IS_FINAL);
        self.frames.push(frame);
        if last {
            Message::new(std::mem::take(&mut self.frames)).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// The header of one frame: how many payload bytes follow, and its flags.
pub(crate) fn frame_header(header: [u8; FRAME_HEADER]) -> Result<(usize, u16), Malformed> {
    let length = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let length = usize::try_from(length)
        .ok()
        .filter(|length| (FRAME_HEADER..=FRAME_HEADER + MAX_FRAME).contains(length))
        .ok_or_else(|| malformed(format!("a frame of length {length}")))?;
    Ok((
        length - FRAME_HEADER,
        u16::from_le_bytes([header[4], header[5]]),
    ))
}

/// A whole message read off the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Message {
    frames: Vec<Frame>,
}

impl Message {
    /// A message of these frames; the first must hold a type and a correlation id.
    pub(crate) fn new(frames: Vec<Frame>) -> Result<Self, Malformed> {
        match frames.first() {
            Some(first) if first.payload.len() >= 12 => Ok(Self { frames }),
            _ => Err(malformed("a message without its type and correlation id")),
        }
    }

    /// Decodes one whole message from `bytes` (tests, and answers read in one piece).
    #[cfg(test)]
    pub(crate) fn decode(mut bytes: &[u8]) -> Result<Self, Malformed> {
        let mut assembler = Assembler::default();
        loop {
            let header: [u8; FRAME_HEADER] = bytes
                .get(..FRAME_HEADER)
                .and_then(|header| header.try_into().ok())
                .ok_or_else(|| malformed("the stream ended inside a frame header"))?;
            let (length, flags) = frame_header(header)?;
            let payload = bytes
                .get(FRAME_HEADER..FRAME_HEADER + length)
                .ok_or_else(|| malformed("the stream ended inside a frame"))?;
            bytes = &bytes[FRAME_HEADER + length..];
            let frame = Frame {
                flags,
                payload: payload.to_vec(),
            };
            if let Some(message) = assembler.push(frame)? {
                return if bytes.is_empty() {
                    Ok(message)
                } else {
                    Err(malformed("bytes after the final frame"))
                };
            }
        }
    }

    pub(crate) fn message_type(&self) -> u32 {
        let first = &self.frames[0].payload;
        u32::from_le_bytes([first[0], first[1], first[2], first[3]])
    }

    pub(crate) fn correlation(&self) -> i64 {
        let first = &self.frames[0].payload;
        i64::from_le_bytes(first[4..12].try_into().unwrap_or([0; 8]))
    }

    /// A member pushed it unasked (an event), rather than answering a request.
    pub(crate) fn is_event(&self) -> bool {
        self.frames[0].is(IS_EVENT)
    }

    /// A reader of a response's parameters: the fixed-size ones in the first frame after
    /// the response header, the variable-size ones in the frames after it.
    pub(crate) fn response(&self) -> Reader<'_> {
        Reader {
            fixed: self.frames[0].payload.get(RESPONSE_HEADER..).unwrap_or(&[]),
            offset: 0,
            frames: &self.frames[1..],
        }
    }
}

/// Walks a message's parameters in the order its definition lists them. A fixed-size
/// parameter the first frame is too short for reads as missing (an older member that
/// lacks it); a variable-size one past the last frame likewise.
#[derive(Debug)]
pub(crate) struct Reader<'m> {
    fixed: &'m [u8],
    offset: usize,
    frames: &'m [Frame],
}

impl<'m> Reader<'m> {
    fn take_fixed(&mut self, size: usize) -> Result<&'m [u8], Malformed> {
        let bytes = self
            .fixed
            .get(self.offset..self.offset + size)
            .ok_or_else(|| malformed("a fixed-size parameter past its frame"))?;
        self.offset += size;
        Ok(bytes)
    }

    pub(crate) fn byte(&mut self) -> Result<u8, Malformed> {
        Ok(self.take_fixed(1)?[0])
    }

    pub(crate) fn boolean(&mut self) -> Result<bool, Malformed> {
        Ok(self.byte()? != 0)
    }

    pub(crate) fn int(&mut self) -> Result<i32, Malformed> {
        let bytes = self.take_fixed(4)?;
        Ok(i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    pub(crate) fn long(&mut self) -> Result<i64, Malformed> {
        let bytes = self.take_fixed(8)?;
        Ok(i64::from_le_bytes(bytes.try_into().unwrap_or([0; 8])))
    }

    pub(crate) fn uuid(&mut self) -> Result<Option<Uuid>, Malformed> {
        let bytes = self.take_fixed(UUID_SIZE)?;
        if bytes[0] != 0 {
            return Ok(None);
        }
        let most = u64::from_le_bytes(bytes[1..9].try_into().unwrap_or([0; 8]));
        let least = u64::from_le_bytes(bytes[9..17].try_into().unwrap_or([0; 8]));
        Ok(Some((most, least)))
    }

    fn next_frame(&mut self) -> Result<&'m Frame, Malformed> {
        let (frame, rest) = self
            .frames
            .split_first()
            .ok_or_else(|| malformed("a parameter past the last frame"))?;
        self.frames = rest;
        Ok(frame)
    }

    fn peek_null(&self) -> bool {
        self.frames.first().is_some_and(|frame| frame.is(IS_NULL))
    }

    /// A string parameter.
    pub(crate) fn string(&mut self) -> Result<String, Malformed> {
        let frame = self.next_frame()?;
        if frame.is(IS_NULL) {
            return Err(malformed("null where a string must be"));
        }
        String::from_utf8(frame.payload.clone()).map_err(|_| malformed("a string not in UTF-8"))
    }

    /// A string parameter that may be null.
    pub(crate) fn nullable_string(&mut self) -> Result<Option<String>, Malformed> {
        if self.peek_null() {
            self.next_frame()?;
            return Ok(None);
        }
        self.string().map(Some)
    }

    /// A serialized value (`Data`) that may be null.
    pub(crate) fn nullable_data(&mut self) -> Result<Option<Vec<u8>>, Malformed> {
        let frame = self.next_frame()?;
        Ok((!frame.is(IS_NULL)).then(|| frame.payload.clone()))
    }

    /// Enters a custom type that has fixed-size fields (every one payonce reads has):
    /// past its BEGIN frame, with those fields. Members may send them in the BEGIN frame
    /// itself or in a frame of their own after it; both are read. The variable-size fields follow from `self`; [`leave`](Self::leave) skips
    /// whatever the caller did not read, up to and past the matching END.
    pub(crate) fn enter(&mut self) -> Result<Reader<'m>, Malformed> {
        let begin = self.next_frame()?;
        if !begin.is(BEGIN_DATA_STRUCTURE) {
            return Err(malformed("a custom type without its BEGIN frame"));
        }
        let fixed = if begin.payload.is_empty() {
            &self.next_frame()?.payload
        } else {
            &begin.payload
        };
        Ok(Reader {
            fixed,
            offset: 0,
            frames: self.frames,
        })
    }

    /// Leaves a custom type or list entered with [`enter`](Self::enter) (or a list begun
    /// with [`begin_list`](Self::begin_list)): `inner` is the reader used inside, and
    /// everything it left unread up to the matching END frame is skipped.
    pub(crate) fn leave(&mut self, inner: Reader<'m>) -> Result<(), Malformed> {
        let mut frames = inner.frames;
        let mut depth = 0_usize;
        loop {
            let (frame, rest) = frames
                .split_first()
                .ok_or_else(|| malformed("a structure without its END frame"))?;
            frames = rest;
            if frame.is(END_DATA_STRUCTURE) {
                if depth == 0 {
                    break;
                }
                depth -= 1;
            } else if frame.is(BEGIN_DATA_STRUCTURE) {
                depth += 1;
            }
        }
        self.frames = frames;
        Ok(())
    }

    /// Skips a custom type that may be null, unread.
    pub(crate) fn skip_nullable_structure(&mut self) -> Result<(), Malformed> {
        if self.peek_null() {
            self.next_frame()?;
            return Ok(());
        }
        let inner = self.begin_list()?;
        self.leave(inner)
    }

    /// Enters a list of variable-size items: past its BEGIN frame. Read items while
    /// [`at_end`](Self::at_end) is false, then [`leave`](Self::leave).
    pub(crate) fn begin_list(&mut self) -> Result<Reader<'m>, Malformed> {
        let begin = self.next_frame()?;
        if !begin.is(BEGIN_DATA_STRUCTURE) {
            return Err(malformed("a list without its BEGIN frame"));
        }
        Ok(Reader {
            fixed: &[],
            offset: 0,
            frames: self.frames,
        })
    }

    /// The next frame closes the structure being read.
    pub(crate) fn at_end(&self) -> bool {
        self.frames
            .first()
            .is_none_or(|frame| frame.is(END_DATA_STRUCTURE))
    }
}
