//! [`Lock`]: a held lock as plain data (resource, token, validity, extensions, and which nodes
//! granted it: [`Votes`]).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::addr::NodeAddr;
use crate::model::config::MAX_TTL;
use crate::model::error::Error;
use crate::model::token::Token;

/// Names up to this long are stored inline: with the length byte and the enum's tag the
/// inline form is 48 bytes, and the usual names fit (no allocation per lock).
const INLINE_LEN: usize = 46;

/// Bytes stored inline when short (no allocation for the usual resource names).
#[derive(Clone, PartialEq, Eq, Hash)]
enum Bytes {
    Inline(u8, [u8; INLINE_LEN]),
    Heap(Box<[u8]>),
}

impl Bytes {
    fn new(b: &[u8]) -> Bytes {
        if b.len() <= INLINE_LEN {
            let mut buf = [0; INLINE_LEN];
            buf[..b.len()].copy_from_slice(b);
            Bytes::Inline(b.len() as u8, buf)
        } else {
            Bytes::Heap(b.into())
        }
    }
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Inline(len, buf) => &buf[..usize::from(*len)],
            Bytes::Heap(b) => b,
        }
    }
}

/// A held lock: what was locked, with which token, and until when it is safe.
///
/// Plain data: it can be released or extended through any [`Client`](crate::Client) or [`Redlock`](crate::Redlock) on the same
/// servers. Dropping it does *not* release it (use [`LockGuard`](crate::LockGuard) for that).
#[derive(Clone, PartialEq, Eq)]
pub struct Lock {
    resource: Bytes,
    token: Token,
    valid_until: Instant,
    extensions: u32,
    fence: Option<u64>,
    /// What each node said when the lock was acquired, and the server list it refers to
    /// (`None` for a lock rebuilt from its parts).
    votes: Votes,
    nodes: Option<Arc<[NodeAddr]>>,
    /// The nodes of `nodes` whose keys back the validity (a bit set; 0: not known): the
    /// acquire's yes set, then each extend's (see [`Lock::backing`]).
    backed: u64,
}

/// What one node contributed to a lock that was acquired: see [`Lock::nodes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockVote {
    /// It said yes: it holds our key.
    Yes,
    /// It refused: another token held the key there.
    Refused,
    /// Its connection was known to be down, backing off or timed out when the lock was
    /// granted: the lock stands on fewer nodes than the server list, and one more failure may
    /// cost the quorum.
    Unreachable,
    /// It answered, but its answer did not count: an error reply, its restart quarantine, or
    /// the same server as another entry.
    Failed,
    /// Its answer had not come when the quorum was reached: not waited for, not a fault (it
    /// is usually a yes that came a moment later).
    NotWaitedFor,
}

/// Per node, as bit sets in the order of the server list, what the nodes said to an acquire
/// that won: `Copy`, no allocation. See [`Lock::votes`] and [`Lock::nodes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Votes {
    pub(crate) yes: u64,
    refused: u64,
    unreachable: u64,
    failed: u64,
    nodes: u8,
}

impl Votes {
    /// The votes of `nodes` nodes, as bit sets (bit `i` for node `i`); a node in no set was
    /// not waited for.
    pub(crate) fn new(
        nodes: usize,
        yes: u64,
        refused: u64,
        unreachable: u64,
        failed: u64,
    ) -> Votes {
        Votes {
            yes,
            refused,
            unreachable,
            failed,
            nodes: nodes as u8,
        }
    }
    /// Nodes in the server list (0 for a lock rebuilt from its parts).
    pub fn nodes(&self) -> usize {
        usize::from(self.nodes)
    }
    /// Nodes that said yes by the time the quorum was reached.
    pub fn yes(&self) -> usize {
        self.yes.count_ones() as usize
    }
    /// Nodes that refused (another token held the key there).
    pub fn refused(&self) -> usize {
        self.refused.count_ones() as usize
    }
    /// Nodes known to be unreachable when the lock was granted ([`LockVote::Unreachable`]).
    pub fn unreachable(&self) -> usize {
        self.unreachable.count_ones() as usize
    }
    /// Node `node`'s vote (`None` beyond the server list).
    pub fn vote(&self, node: usize) -> Option<LockVote> {
        if node >= self.nodes() {
            return None;
        }
        let bit = 1u64 << node;
        Some(if self.yes & bit != 0 {
            LockVote::Yes
        } else if self.refused & bit != 0 {
            LockVote::Refused
        } else if self.unreachable & bit != 0 {
            LockVote::Unreachable
        } else if self.failed & bit != 0 {
            LockVote::Failed
        } else {
            LockVote::NotWaitedFor
        })
    }
}

impl Lock {
    /// A lock known by its parts, e.g. a token printed by `redlock acquire` in another process.
    /// `validity` is how long it is believed valid from now.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty resource or a bad token, and for a token of an all-or-none
    /// lock ([`ResourceSet`]) given with other names than the set's — a part of it, say: that
    /// part's release would leave the others held while the holder believes the set released;
    /// [`Error::ReservedName`] for a name in the namespace this crate keeps for its own keys
    /// ([`crate::RESERVED_PREFIX`]).
    ///
    /// # Examples
    ///
    /// A script took the lock with `redlock acquire` and handed its token over; this process
    /// releases it:
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_mux::{Lock, Redlock};
    ///
    /// let redlock = Redlock::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
    /// let token = std::env::var("TOKEN").unwrap_or_default();
    /// let lock = Lock::from_parts("batch:import", token, Duration::from_secs(10))?;
    /// let released = redlock.unlock(lock)?; // 0: nobody held it with this token any more
    /// # let _ = released;
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn from_parts(
        resource: impl AsRef<[u8]>,
        token: impl AsRef<[u8]>,
        validity: Duration,
    ) -> Result<Lock, Error> {
        let (resource, token) = (resource.as_ref(), token.as_ref());
        crate::model::keys::check_resource(resource, crate::model::keys::check_lock_name)?;
        let token = Token::from_bytes(token)?;
        token.check_for(resource)?;
        Ok(Lock {
            resource: Bytes::new(resource),
            token,
            valid_until: Instant::now() + validity.min(MAX_TTL),
            extensions: 0,
            fence: None,
            votes: Votes::default(),
            nodes: None,
            backed: 0,
        })
    }

    /// The same lock with its fence, e.g. `REDLOCK_FENCE` as `redlock run` exported it: for a
    /// lock rebuilt from its parts in another process.
    pub fn with_fence(mut self, fence: u64) -> Lock {
        self.fence = Some(fence);
        self
    }

    /// A lock just acquired.
    pub(crate) fn new(resource: &[u8], token: Token, valid_until: Instant) -> Lock {
        Lock {
            resource: Bytes::new(resource),
            token,
            valid_until,
            extensions: 0,
            fence: None,
            votes: Votes::default(),
            nodes: None,
            backed: 0,
        }
    }

    /// A lock just acquired, as its grant says.
    pub(crate) fn granted(resource: &[u8], token: Token, grant: Grant) -> Lock {
        Lock {
            fence: grant.fence,
            backed: grant.votes.yes,
            votes: grant.votes,
            nodes: grant.nodes,
            ..Lock::new(resource, token, grant.valid_until)
        }
    }

    /// The locked resource (the Redis key): bytes (it derefs to `[u8]`) with a readable
    /// `Debug`.
    pub fn resource(&self) -> &Resource {
        Resource::new(self.resource.as_slice())
    }
    /// The token stored on the nodes.
    pub fn token(&self) -> &Token {
        &self.token
    }
    /// When the validity runs out.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }
    /// The validity left now (zero once expired).
    pub fn validity(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }
    /// True while validity is left.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }
    /// The fencing token of this acquisition ([`Config::fencing`](crate::Config::fencing)):
    /// greater than the fence of every acquisition that completed before this one began, on
    /// any resource, by any client of this crate on the same servers. Pass it to the resource
    /// the lock protects, which refuses anything with a fence lower than the highest it has
    /// seen. `None` for a lock acquired without fencing.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }
    /// How often the lock was extended.
    pub fn extensions(&self) -> u32 {
        self.extensions
    }
    /// What each node said when the lock was acquired, as counts and bit sets (empty for a
    /// lock rebuilt with [`Lock::from_parts`]).
    ///
    /// ```no_run
    /// # let redlock = redlock_mux::Builder::new(["redis://127.0.0.1:7001"]).quarantine(None).build()?;
    /// let lock = redlock.lock("orders:42")?;
    /// if lock.votes().unreachable() > 0 {
    ///     eprintln!("acquired with nodes down: {:?}", lock.unreachable().collect::<Vec<_>>());
    /// }
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn votes(&self) -> Votes {
        self.votes
    }

    /// The nodes of `servers` (a bit set) whose keys back this lock's validity — those that
    /// said yes to its acquire, then to the last extend that won (it moved the validity past
    /// the expiry of the nodes not in its own yes set), joined by those that said yes to a lost
    /// extend since and left by those that refused one — or 0 when that is not known: a lock
    /// rebuilt from its parts, or acquired on another server list (other nodes, or another
    /// order).
    pub(crate) fn backing(&self, servers: &[NodeAddr]) -> u64 {
        match &self.nodes {
            Some(nodes) if **nodes == *servers => self.backed,
            _ => 0,
        }
    }

    /// After an extend through an engine of `servers` that said yes on the nodes in `yes` (a
    /// bit set) and, if it was lost, refused on those in `refused` (`None`: a loss that says
    /// nothing of the nodes, a credentials error): see [`Lock::backing`]. Through an engine of
    /// another server list, or with nothing said, the backing is no longer known — kept, it
    /// would vouch for the old list's nodes until a validity that the extend moved (review).
    pub(crate) fn extended_on(
        &mut self,
        servers: &[NodeAddr],
        won: bool,
        votes: Option<(u64, u64)>,
    ) {
        self.backed = backing_after_extend(self.backing(servers), won, votes);
    }

    /// The backing as a kept lock's keep-alive tracks it (`Kept::backed`).
    pub(crate) fn set_backed(&mut self, backed: u64) {
        self.backed = backed;
    }
    /// Every node, in the order of the server list, with what it said when the lock was
    /// acquired (nothing for a lock rebuilt with [`Lock::from_parts`]). A node whose answer had
    /// not come when the quorum was reached is [`LockVote::NotWaitedFor`], not unreachable.
    pub fn nodes(&self) -> impl Iterator<Item = (&NodeAddr, LockVote)> + '_ {
        let nodes: &[NodeAddr] = self.nodes.as_deref().unwrap_or(&[]);
        nodes
            .iter()
            .enumerate()
            .filter_map(|(i, node)| self.votes.vote(i).map(|v| (node, v)))
    }
    /// The nodes known to be unreachable (down, backing off, timed out) when the lock was
    /// acquired.
    pub fn unreachable(&self) -> impl Iterator<Item = &NodeAddr> + '_ {
        self.nodes()
            .filter(|(_, v)| *v == LockVote::Unreachable)
            .map(|(node, _)| node)
    }

    pub(crate) fn set_state(&mut self, valid_until: Instant, extensions: u32) {
        self.valid_until = valid_until;
        self.extensions = extensions;
    }
}

/// The nodes that back a lock (a bit set, not 0) after an extend that said yes on `yes` and, if
/// it was lost (`!won`), refused on `refused` (`votes`; `None`: a loss that says nothing of the
/// nodes): a won extend's yes set (it moved the validity past the others' expiry); after a lost
/// one, the backing with its yeses (they now hold our token past the validity) and without its
/// refusals. A backing not known (0), or a loss that says nothing, gives 0: not known.
pub(crate) fn backing_after_extend(backed: u64, won: bool, votes: Option<(u64, u64)>) -> u64 {
    match votes {
        Some((yes, _)) if backed != 0 && won => yes,
        Some((yes, refused)) if backed != 0 => (backed | yes) & !refused,
        _ => 0,
    }
}

/// An extend's outcome as [`backing_after_extend`] reads it: whether it won, and the nodes
/// that said yes and refused (`None` for a loss without a node-by-node report).
pub(crate) fn extend_votes(result: &Result<u64, Error>) -> (bool, Option<(u64, u64)>) {
    match result {
        Ok(yes) => (true, Some((*yes, 0))),
        Err(e) => (false, e.report().map(|r| (r.said_yes, r.refused))),
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("resource", &self.resource())
            .field("token", &self.token)
            .field("validity", &self.validity())
            .field("extensions", &self.extensions)
            .field("fence", &self.fence)
            .field("votes", &self.votes)
            .finish()
    }
}

/// A won acquire: until when it is valid, its fence (fenced locks), and what each node said
/// (with the server list the votes refer to: a reference count, no allocation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub valid_until: Instant,
    pub fence: Option<u64>,
    pub votes: Votes,
    pub nodes: Option<Arc<[NodeAddr]>>,
}

/// A resource name: the bytes of a Redis key. Derefs to `[u8]`; `Debug` shows it as a string,
/// with bytes that are not printable ASCII escaped (`"orders:42"`, `"blob\\xff"`), and `Display`
/// as text (invalid UTF-8 replaced).
#[repr(transparent)]
#[derive(PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource([u8]);

impl Resource {
    /// The name as a `Resource`.
    #[allow(unsafe_code)]
    pub fn new(bytes: &[u8]) -> &Resource {
        // SAFETY: `Resource` is `repr(transparent)` over `[u8]`: same layout, same metadata
        // (the length), so the pointer cast keeps both (as `std::path::Path` does over
        // `OsStr`); the lifetime of the result is that of `bytes`.
        unsafe { &*(bytes as *const [u8] as *const Resource) }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The resource a shared (read) lock is of ([`Shared`]); `None` for another lock.
    pub fn shared_name(&self) -> Option<&Resource> {
        crate::model::keys::shared_name(&self.0).map(Resource::new)
    }

    /// The resources of an all-or-none lock ([`ResourceSet`]), in order; `None` for a
    /// single resource.
    pub fn members(&self) -> Option<crate::model::keys::Members<'_>> {
        crate::model::keys::set_members(&self.0)
    }

    /// True if a caller that holds this lock must not wait for `wanted`: waiting could only
    /// end when the held lock is released. The rule `with_lock` refuses a nested acquire by
    /// ([`Error::AlreadyHeld`]): they name a resource in common —
    /// a plain name, a [`Shared`] lock of it and every [`ResourceSet`] that has it as a member
    /// all lock the one resource — and are not both shared locks of different names. A shared
    /// lock of the very name held shared counts: readers share, but a writer that waits
    /// meanwhile keeps new readers out while it waits for the held one. For a tool that runs a
    /// command under a lock, as `redlock run` does.
    ///
    /// ```
    /// use redlock_mux::{Resource, ResourceSet, Shared};
    ///
    /// let set = ResourceSet::new(["a", "b"])?;
    /// assert!(set.as_resource().excludes(Resource::new(b"a")));
    /// let read = Shared::new("cfg")?;
    /// assert!(Resource::new(read.as_ref()).excludes(Resource::new(b"cfg")));
    /// let other = Shared::new("other")?;
    /// assert!(!Resource::new(read.as_ref()).excludes(Resource::new(other.as_ref())));
    /// assert!(!Resource::new(b"a").excludes(Resource::new(b"b")));
    /// # Ok::<(), redlock_mux::Error>(())
    /// ```
    pub fn excludes(&self, wanted: &Resource) -> bool {
        crate::model::keys::excludes(&self.0, &wanted.0)
    }
}

/// A shared (read) lock of a resource: many readers hold it at once, and none while a writer
/// (an ordinary lock of the same name) holds it. Pass it wherever a resource name goes
/// ([`Redlock::lock`](crate::Redlock::lock), `try_lock`, `with_lock`, the async handle's, a
/// [`Client`](crate::Client)'s), or use the `*_shared` shorthands
/// ([`Redlock::lock_shared`](crate::Redlock::lock_shared)).
///
/// On each node the readers of `name` are a sorted set under the key `name` itself (each
/// reader's token scored by its expiry), so a writer's `SET NX` — this crate's or any Redlock
/// client's — fails while any reader holds it, and a reader is refused while a writer holds
/// it. A reader quorum and a writer quorum are both majorities, so they meet on a node that
/// refused one of them: never a writer with a reader. Each reader has its own expiry: a
/// crashed reader blocks nobody past its TTL.
///
/// **Writers are not starved:** a writer that waits (`lock`, `lock_until`) marks the resource
/// on every node, and new readers are refused while the mark is there; readers that already
/// hold it finish (and may extend), the writer gets it when the last one leaves. A writer that
/// gives up leaves its mark to expire (at least a second, two fallback polls). Readers get no
/// fence (a fence orders writers).
///
/// ```no_run
/// use redlock_mux::{Redlock, Shared};
///
/// let redlock = Redlock::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
/// let read = redlock.lock_shared("config")?;     // many readers at once
/// // ... read the config ...
/// redlock.unlock(read)?;
/// let write = redlock.lock("config")?;           // the writer: alone
/// redlock.unlock(write)?;
/// # let _ = Shared::new("config")?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Shared {
    encoded: Vec<u8>,
}

impl Shared {
    /// The shared lock of `name`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an empty name; [`Error::ReservedName`] for a name starting with
    /// `redlock:`.
    pub fn new(name: impl AsRef<[u8]>) -> Result<Shared, Error> {
        let name = name.as_ref();
        crate::model::keys::check_lock_name(name)?;
        let mut encoded = crate::model::keys::SHARED_PREFIX.as_bytes().to_vec();
        encoded.extend_from_slice(name);
        Ok(Shared { encoded })
    }

    /// The resource it is a shared lock of.
    pub fn name(&self) -> &Resource {
        Resource::new(&self.encoded[crate::model::keys::SHARED_PREFIX.len()..])
    }
}

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.encoded
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Shared").field(&self.name()).finish()
    }
}

/// Resources locked all or none, in one round trip: pass it wherever a resource name goes
/// ([`Redlock::lock`](crate::Redlock::lock), `try_lock`, `lock_until`, `with_lock`, the
/// async handle's, a [`Client`](crate::Client)'s), and the lock holds every member or none.
///
/// On each node one script sets every member to the lock's token if none of them exists
/// (else none), and the lock is won on a quorum of nodes for the whole set, with one validity;
/// release and extend take every member. Each member is an ordinary lock key, so a set
/// excludes — and is excluded by — a plain lock of any member, another set sharing a member,
/// and any other Redlock client's `SET NX` of a member. No ordering is needed to avoid
/// deadlock: an attempt takes all or nothing, then waits as a single lock's waiters do
/// (release notices of every member, then the fallback poll, with jitter on split votes). A
/// waiting set has no preference over readers ([`Shared`]) of its members: readers that keep
/// coming can keep it waiting, as they could not a plain lock's waiting writer.
///
/// The members are sorted and deduplicated: `["b", "a", "a"]` and `["a", "b"]` are the same
/// lock. At most [`MAX_SET_LEN`](crate::MAX_SET_LEN) members, each a valid resource name.
///
/// ```no_run
/// use redlock_mux::{Redlock, ResourceSet};
///
/// let redlock = Redlock::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
/// let accounts = ResourceSet::new(["account:alice", "account:bob"])?;
/// let lock = redlock.lock(&accounts)?; // both or neither
/// // ... move money from alice to bob ...
/// redlock.unlock(lock)?;
/// # Ok::<(), redlock_mux::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ResourceSet {
    encoded: Vec<u8>,
}

impl ResourceSet {
    /// The set of `names`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for no name, more than [`MAX_SET_LEN`](crate::MAX_SET_LEN), or
    /// an empty name; [`Error::ReservedName`] for a name starting with `redlock:`. (A name
    /// longer than the handle's `max_resource_len` is refused when it is locked.)
    pub fn new<I, R>(names: I) -> Result<ResourceSet, Error>
    where
        I: IntoIterator<Item = R>,
        R: AsRef<[u8]>,
    {
        let names: Vec<R> = names.into_iter().collect();
        let encoded = crate::model::keys::encode_set(&names, |name| match name.is_empty() {
            true => Err(Error::Config("empty resource name in a set".into())),
            false => crate::model::keys::check_name(name),
        })?;
        Ok(ResourceSet { encoded })
    }

    /// The members, sorted, without duplicates.
    pub fn members(&self) -> crate::model::keys::Members<'_> {
        crate::model::keys::set_members(&self.encoded).expect("a set's encoding")
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members().count()
    }

    /// Always false: a set has at least one member.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The set as the resource its lock has ([`Lock::resource`]).
    pub fn as_resource(&self) -> &Resource {
        Resource::new(&self.encoded)
    }
}

impl AsRef<[u8]> for ResourceSet {
    fn as_ref(&self) -> &[u8] {
        &self.encoded
    }
}

impl fmt::Debug for ResourceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.members().map(Resource::new))
            .finish()
    }
}

impl fmt::Display for ResourceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_resource(), f)
    }
}

impl std::ops::Deref for Resource {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for Resource {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

impl fmt::Display for Resource {
    /// A set shows as its members in braces: `{account:alice, account:bob}`; a shared lock's
    /// resource as `config (shared)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(name) = self.shared_name() {
            return write!(f, "{name} (shared)");
        }
        let Some(members) = self.members() else {
            return f.write_str(&String::from_utf8_lossy(&self.0));
        };
        f.write_str("{")?;
        for (i, member) in members.enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(&String::from_utf8_lossy(member))?;
        }
        f.write_str("}")
    }
}

impl PartialEq<[u8]> for Resource {
    fn eq(&self, other: &[u8]) -> bool {
        &self.0 == other
    }
}

impl PartialEq<&[u8]> for Resource {
    fn eq(&self, other: &&[u8]) -> bool {
        &self.0 == *other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for Resource {
    fn eq(&self, other: &[u8; N]) -> bool {
        self.0 == other[..]
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for Resource {
    fn eq(&self, other: &&[u8; N]) -> bool {
        self.0 == other[..]
    }
}

impl PartialEq<str> for Resource {
    fn eq(&self, other: &str) -> bool {
        &self.0 == other.as_bytes()
    }
}

impl PartialEq<&str> for Resource {
    fn eq(&self, other: &&str) -> bool {
        &self.0 == other.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_reads_as_text_and_compares_as_bytes() {
        let lock = Lock::from_parts("orders:42", [b'a'; 16], Duration::from_secs(1)).unwrap();
        assert_eq!(format!("{:?}", lock.resource()), "\"orders:42\"");
        assert_eq!(lock.resource().to_string(), "orders:42");
        assert!(lock.resource() == b"orders:42");
        assert!(*lock.resource() == *"orders:42");
        let odd = Resource::new(b"a\"b\xff\n");
        assert_eq!(format!("{odd:?}"), "\"a\\\"b\\xff\\n\"");
        assert!(format!("{lock:?}").contains("resource: \"orders:42\""));
        let bytes: &[u8] = lock.resource();
        assert_eq!(bytes, b"orders:42");
    }

    #[test]
    fn the_backing_follows_the_extends_of_a_lock_of_the_same_server_list() {
        let parse = |list: &[&str]| -> Arc<[NodeAddr]> {
            list.iter().map(|s| NodeAddr::parse(s).unwrap()).collect()
        };
        let servers = parse(&["redis://a:1", "redis://b:2", "redis://c:3"]);
        let lock = Lock {
            votes: Votes::new(3, 0b011, 0, 0, 0),
            nodes: Some(servers.clone()),
            backed: 0b011,
            ..Lock::from_parts("job", [b'a'; 16], Duration::from_secs(1)).unwrap()
        };
        assert_eq!(lock.backing(&servers), 0b011);
        // Kept by an engine of another list, or of the same nodes in another order.
        let reordered = parse(&["redis://c:3", "redis://a:1", "redis://b:2"]);
        assert_eq!(lock.backing(&reordered), 0);
        assert_eq!(lock.backing(&servers[..2]), 0);
        // Extended since: the extend's own yes set backs it.
        let mut extended = lock.clone();
        extended.extended_on(&servers, true, Some((0b110, 0)));
        assert_eq!(extended.backing(&servers), 0b110);
        // A lost extend: its yeses join, its refusals leave.
        extended.extended_on(&servers, false, Some((0b001, 0b010)));
        assert_eq!(extended.backing(&servers), 0b101);
        // A loss that says nothing of the nodes: no longer known.
        extended.extended_on(&servers, false, None);
        assert_eq!(extended.backing(&servers), 0);
        // Through an engine of another list: no longer known (the validity moved).
        let mut other = lock.clone();
        other.extended_on(&reordered, true, Some((0b111, 0)));
        assert_eq!(other.backing(&servers), 0);
        // Rebuilt from its parts.
        let parts = Lock::from_parts("job", [b'a'; 16], Duration::from_secs(1)).unwrap();
        assert_eq!(parts.backing(&servers), 0);
    }
}
