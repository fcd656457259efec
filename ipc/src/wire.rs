//! The messages. Each lane call is described once, in `wire_calls!` below; the macro derives
//! the request struct, the `Request` enum, the typed reply (`Call::Reply`), the flight-recorder
//! op name and the worker's `Handler` trait and `dispatch` from that one line.

use serde::{Deserialize, Serialize};

use crate::cl::*;
pub use crate::inline::{ArgBytes, Dims};

/// An object as both sides name it. The shim allocates ids for objects it creates (so an
/// enqueue that returns an event need not wait to learn its name); the worker allocates ids,
/// with `WORKER_ID_BIT` set, for what the driver enumerates (platforms, devices).
pub type ObjectId = u64;
pub const WORKER_ID_BIT: u64 = 1 << 63;

/// The types of OpenCL object, as both ends' handle tables know them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    Platform,
    Device,
    Context,
    Queue,
    Mem,
    Program,
    Kernel,
    Event,
    Sampler,
    CommandBuffer,
}

impl ObjectKind {
    /// The error for a handle that is not a live object of this kind.
    pub fn invalid(self) -> cl_int {
        match self {
            ObjectKind::Platform => CL_INVALID_PLATFORM,
            ObjectKind::Device => CL_INVALID_DEVICE,
            ObjectKind::Context => CL_INVALID_CONTEXT,
            ObjectKind::Queue => CL_INVALID_COMMAND_QUEUE,
            ObjectKind::Mem => CL_INVALID_MEM_OBJECT,
            ObjectKind::Program => CL_INVALID_PROGRAM,
            ObjectKind::Kernel => CL_INVALID_KERNEL,
            ObjectKind::Event => CL_INVALID_EVENT,
            ObjectKind::Sampler => CL_INVALID_SAMPLER,
            ObjectKind::CommandBuffer => CL_INVALID_COMMAND_BUFFER_KHR,
        }
    }
}

/// Which `clGet*Info` function an info query goes to; `aux` in `GetInfo` carries the second
/// object or index that some of them take.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InfoTarget {
    Platform,
    Device,
    Context,
    CommandQueue,
    MemObject,
    Image,
    Sampler,
    Program,
    /// `aux` = device.
    ProgramBuild,
    Kernel,
    /// `aux` = device (0 for NULL).
    KernelWorkGroup,
    /// `aux` = argument index.
    KernelArg,
    Event,
    EventProfiling,
    Pipe,
    CommandBuffer,
}

impl InfoTarget {
    /// The kind of object the query's handle must be.
    pub fn object_kind(self) -> ObjectKind {
        match self {
            InfoTarget::Platform => ObjectKind::Platform,
            InfoTarget::Device => ObjectKind::Device,
            InfoTarget::Context => ObjectKind::Context,
            InfoTarget::CommandQueue => ObjectKind::Queue,
            InfoTarget::MemObject | InfoTarget::Image | InfoTarget::Pipe => ObjectKind::Mem,
            InfoTarget::Sampler => ObjectKind::Sampler,
            InfoTarget::Program | InfoTarget::ProgramBuild => ObjectKind::Program,
            InfoTarget::Kernel | InfoTarget::KernelWorkGroup | InfoTarget::KernelArg => ObjectKind::Kernel,
            InfoTarget::Event | InfoTarget::EventProfiling => ObjectKind::Event,
            InfoTarget::CommandBuffer => ObjectKind::CommandBuffer,
        }
    }
}

/// How a handle-valued info result is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleLayout {
    One,
    Array,
    /// A zero-terminated property list whose `CL_CONTEXT_PLATFORM` value is a platform.
    ContextProperties,
}

/// Info results that hold handles: the worker turns driver handles into ids, the shim turns
/// ids into its own handles. One table, so the two sides cannot disagree.
pub fn handle_layout(t: InfoTarget, param: u32) -> Option<HandleLayout> {
    use InfoTarget::*;
    Some(match (t, param) {
        (Device, 0x1031) | (Device, 0x1042) => HandleLayout::One,
        (Context, 0x1081) => HandleLayout::Array,
        (Context, 0x1082) => HandleLayout::ContextProperties,
        (CommandQueue, 0x1090) | (CommandQueue, 0x1091) | (CommandQueue, 0x1095) => HandleLayout::One,
        (MemObject, 0x1106) | (MemObject, 0x1107) | (Image, 0x1118) => HandleLayout::One,
        (Sampler, 0x1151) => HandleLayout::One,
        (Program, 0x1161) => HandleLayout::One,
        (Program, 0x1163) => HandleLayout::Array,
        (Kernel, 0x1193) | (Kernel, 0x1194) => HandleLayout::One,
        (Event, 0x11D0) | (Event, 0x11D4) => HandleLayout::One,
        (CommandBuffer, 0x1294) => HandleLayout::Array,
        _ => return None,
    })
}

/// Rewrites every handle-sized slot that `layout` says holds a handle.
pub fn map_handles(layout: HandleLayout, value: &mut [u8], mut f: impl FnMut(u64) -> u64) {
    const W: usize = 8;
    let mut swap = |chunk: &mut [u8]| {
        let mut b = [0u8; W];
        b.copy_from_slice(chunk);
        chunk.copy_from_slice(&f(u64::from_ne_bytes(b)).to_ne_bytes());
    };
    match layout {
        HandleLayout::One | HandleLayout::Array => value.chunks_exact_mut(W).for_each(swap),
        HandleLayout::ContextProperties => {
            let mut pairs = value.chunks_exact_mut(W);
            while let Some(key) = pairs.next() {
                let mut b = [0u8; W];
                b.copy_from_slice(key);
                let k = i64::from_ne_bytes(b);
                let Some(v) = pairs.next() else { break };
                if k == 0x1084 {
                    swap(v);
                }
            }
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct InfoReply {
    /// The size query's status (`param_value == NULL`).
    pub status: i32,
    /// The value query's status: drivers can accept the first and refuse the second, and the
    /// application must see exactly that.
    pub value_status: i32,
    /// The whole value; the shim applies the `param_value_size` protocol itself.
    #[serde(with = "crate::bulk")]
    pub value: Vec<u8>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IdsReply {
    pub status: i32,
    pub ids: Vec<ObjectId>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TimersReply {
    pub status: i32,
    pub device_timestamp: u64,
    pub host_timestamp: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CountReply {
    pub status: i32,
    pub count: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct StatusesReply {
    pub status: i32,
    /// One status per device (`binary_status` of `clCreateProgramWithBinary`).
    pub statuses: Vec<i32>,
}

/// One event as the trace and the timing report need it (`EventProfiles`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventProfile {
    /// `CL_EVENT_COMMAND_EXECUTION_STATUS`, or the error of asking it.
    pub status: i32,
    /// `CL_PROFILING_COMMAND_START` and `CL_PROFILING_COMMAND_END` of a complete event whose
    /// driver answered both.
    pub times: Option<(u64, u64)>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ProfilesReply {
    pub status: i32,
    /// One per event asked, in order.
    pub profiles: Vec<EventProfile>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct CreatedReply {
    pub status: i32,
    /// The driver returned an object (`clLinkProgram` can, even when it fails).
    pub created: bool,
    /// As in `BuildReply`.
    pub callback_sent: bool,
}

/// A build, compile or link with a callback.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BuildReply {
    pub status: i32,
    /// The driver called the callback before its call returned, so `BuildDone` is on its way:
    /// the shim returns once the application's callback has run, as a direct call would.
    pub callback_sent: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BinariesReply {
    pub status: i32,
    #[serde(with = "crate::bulk")]
    pub binaries: Vec<Vec<u8>>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct FormatsReply {
    pub status: i32,
    /// `(image_channel_order, image_channel_data_type)` pairs.
    pub formats: Vec<(u32, u32)>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct MapImageReply {
    pub status: i32,
    /// The pitches of the data in the segment (packed rows).
    pub row_pitch: u64,
    pub slice_pitch: u64,
}

/// `cl_image_desc`, with the buffer of a 1D-buffer or buffer-backed 2D image as its id.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageDesc {
    pub image_type: u32,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub array_size: u64,
    pub row_pitch: u64,
    pub slice_pitch: u64,
    pub num_mip_levels: u32,
    pub num_samples: u32,
    pub buffer: Option<ObjectId>,
}

/// The device side of a rectangular transfer. The host side is always packed: rows of the
/// region's width, back to back (the shim packs and unpacks the application's pitches), so
/// the driver gets host pitches of 0.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum RegionTarget {
    /// `clEnqueueRead/WriteImage` at `origin` (in pixels).
    Image { origin: [u64; 3] },
    /// `clEnqueueRead/WriteBufferRect` at `origin` (in bytes) with the buffer's pitches.
    BufferRect { origin: [u64; 3], row_pitch: u64, slice_pitch: u64 },
}

/// The application's headers a build needs (the worker cannot read the application's files):
/// the `-I` folders in order (the application's working folder last), and each header found,
/// by its absolute path. `macro_dirs` are the `-D NAME=FOLDER` options whose value is a folder
/// (an include may be named by a macro built from it, `#include M2S(NAME/x.h)`): their headers
/// are shipped too, and the worker defines NAME as its copy of the folder.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AppIncludes {
    pub dirs: Vec<String>,
    #[serde(with = "crate::bulk")]
    pub files: Vec<(String, Vec<u8>)>,
    pub macro_dirs: Vec<(String, String)>,
}

impl AppIncludes {
    /// Every folder the set lays out: the `-I` ones and the macros' ones.
    pub fn folders(&self) -> impl Iterator<Item = &String> {
        self.dirs.iter().chain(self.macro_dirs.iter().map(|(_, d)| d))
    }
}

/// Which of the four region copies: `src_origin[0]` / `dst_origin[0]` are the buffer offsets
/// of the image-buffer copies; the pitches are used by buffer-rect copies only.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    BufferRect,
    Image,
    ImageToBuffer,
    BufferToImage,
}

/// A command recorded into a command buffer (cl_khr_command_buffer): the arguments of the
/// matching `clCommand*KHR` call, minus the buffer, queue and sync points.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum RecordedCommand {
    Barrier,
    CopyBuffer {
        src: ObjectId,
        dst: ObjectId,
        src_offset: u64,
        dst_offset: u64,
        size: u64,
    },
    /// As `EnqueueCopyRegion`.
    CopyRegion {
        src: ObjectId,
        dst: ObjectId,
        kind: CopyKind,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
        src_pitches: (u64, u64),
        dst_pitches: (u64, u64),
    },
    FillBuffer {
        mem: ObjectId,
        #[serde(with = "crate::bulk")]
        pattern: Vec<u8>,
        offset: u64,
        size: u64,
    },
    FillImage {
        mem: ObjectId,
        #[serde(with = "crate::bulk")]
        color: Vec<u8>,
        origin: [u64; 3],
        region: [u64; 3],
    },
    /// `args` as for `EnqueueNdRange`: the driver's kernel holds them when the command is recorded.
    NdRange {
        kernel: ObjectId,
        args: Vec<(u32, ArgValue)>,
        properties: Option<Vec<u64>>,
        work_dim: u32,
        offset: Option<Dims>,
        global: Option<Dims>,
        local: Option<Dims>,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SyncPointReply {
    pub status: i32,
    pub sync_point: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct KernelReply {
    pub status: i32,
    pub num_args: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct KernelsReply {
    pub status: i32,
    pub count: u32,
    pub num_args: Vec<u32>,
}

/// Where bulk bytes are: in the calling lane's bulk area, or in a shared segment.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataRef {
    Lane { offset: u64, len: u64 },
    Segment { id: u64, offset: u64, len: u64 },
}

impl DataRef {
    pub fn len(&self) -> u64 {
        match *self {
            DataRef::Lane { len, .. } | DataRef::Segment { len, .. } => len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a zero-copy buffer's memory lies, in a segment the shim sent (`CreateBuffer`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferMemory {
    /// The whole segment, this buffer's alone: the worker takes it out of its table.
    Whole { segment: u64 },
    /// `offset` bytes into a slab that small buffers share (one segment sent for many
    /// buffers): it stays in the worker's table until the shim drops it, and stays mapped
    /// until the last buffer in it is destroyed.
    Slab { segment: u64, offset: u64 },
}

/// A kernel argument as recorded by `clSetKernelArg` in the shim and shipped with the enqueue.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ArgValue {
    Bytes(ArgBytes),
    /// A memory object or sampler handle, translated to its id.
    Object(ObjectId),
    /// `arg_value == NULL`: a `__local` buffer of this many bytes.
    Local(u64),
}

/// The event wait list and the event an enqueue returns.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct EnqueueSync {
    pub wait: Vec<ObjectId>,
    pub event: Option<ObjectId>,
}

/// A lane call: its request type knows its reply type and its name.
pub trait Call: Serialize {
    type Reply: serde::de::DeserializeOwned + Serialize;
    const NAME: &'static str;
    fn into_request(self) -> Request;
}

/// The worker's side of one call.
pub trait Serve<C: Call> {
    fn serve(&self, req: C) -> C::Reply;
}

macro_rules! wire_calls {
    ($( $(#[$doc:meta])* $name:ident { $($(#[$fattr:meta])* $field:ident : $fty:ty),* $(,)? } -> $reply:ty; )*) => {
        $(
            $(#[$doc])*
            #[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
            pub struct $name { $($(#[$fattr])* pub $field: $fty),* }

            impl Call for $name {
                type Reply = $reply;
                const NAME: &'static str = stringify!($name);
                fn into_request(self) -> Request { Request::$name(self) }
            }
        )*

        /// Every lane request. The variant order is the wire format: bump
        /// `PROTOCOL_VERSION` when it changes.
        #[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
        pub enum Request { $($name($name)),* }

        impl Request {
            /// The call's name, for the flight recorder and logs.
            pub fn op_name(&self) -> &'static str {
                match self { $(Request::$name(_) => stringify!($name)),* }
            }

            /// The call's index in `OP_NAMES`, as the flight recorder stores it.
            pub fn op_index(&self) -> u32 {
                let mut i = 0u32;
                $(
                    if matches!(self, Request::$name(_)) {
                        return i;
                    }
                    i += 1;
                )*
                i
            }
        }

        /// Every call's name, by `op_index`.
        pub const OP_NAMES: &[&str] = &[$(stringify!($name)),*];

        /// What the worker implements: every call, each served (`Serve<Call>`) in the module of
        /// its API object, as the shim's entry points are.
        pub trait Handler: $(Serve<$name> +)* {}

        impl<T: ?Sized $(+ Serve<$name>)*> Handler for T {}

        /// Runs `req` on `handler` and encodes the typed reply.
        pub fn dispatch<H: Handler + ?Sized>(handler: &H, req: Request) -> Result<Vec<u8>, postcard::Error> {
            match req { $(Request::$name(r) => crate::encode(&Serve::<$name>::serve(handler, r))),* }
        }

        /// `dispatch`, appending the encoded reply to `out` (a worker that keeps `out` answers
        /// without allocating once it has grown).
        pub fn dispatch_into<H: Handler + ?Sized>(
            handler: &H,
            req: Request,
            out: &mut Vec<u8>,
        ) -> Result<(), postcard::Error> {
            match req { $(Request::$name(r) => crate::encode_into(&Serve::<$name>::serve(handler, r), out)),* }
        }
    };
}

wire_calls! {
    /// Any `clGet*Info`; handle-valued results come back as ids.
    GetInfo { target: InfoTarget, object: ObjectId, aux: u64, param: u32 } -> InfoReply;
    GetDeviceIds { platform: ObjectId, device_type: u64 } -> IdsReply;
    /// The application's last reference is gone; the worker drops its own.
    Release { object: ObjectId } -> i32;
    CreateContext {
        id: ObjectId, properties: Option<Vec<i64>>, devices: Vec<ObjectId>, notify: Option<u64>,
    } -> i32;
    CreateContextFromType {
        id: ObjectId, properties: Option<Vec<i64>>, device_type: u64, notify: Option<u64>,
    } -> i32;
    CreateCommandQueue {
        id: ObjectId, context: ObjectId, device: ObjectId, properties: u64,
    } -> i32;
    CreateCommandQueueWithProperties {
        id: ObjectId, context: ObjectId, device: ObjectId, properties: Option<Vec<u64>>,
    } -> i32;
    /// `properties` is `Some` for `clCreateBufferWithProperties`.
    /// `memory`: a zero-copy buffer's own memory, `size` bytes in a segment the shim sent
    /// (and filled with any `CL_MEM_COPY_HOST_PTR` data): the worker creates the buffer with
    /// `CL_MEM_USE_HOST_PTR` over them and keeps them mapped as long as the driver's buffer
    /// lives.
    CreateBuffer {
        id: ObjectId, context: ObjectId, properties: Option<Vec<u64>>, flags: u64, size: u64,
        host_data: Option<DataRef>, memory: Option<BufferMemory>,
    } -> i32;
    CreateSubBuffer { id: ObjectId, buffer: ObjectId, flags: u64, origin: u64, size: u64 } -> i32;
    /// `host_data` holds the application's host memory with the pitches of `desc`.
    CreateImage {
        id: ObjectId, context: ObjectId, properties: Option<Vec<u64>>, flags: u64, format: (u32, u32),
        desc: ImageDesc, host_data: Option<DataRef>,
    } -> i32;
    CreatePipe { id: ObjectId, context: ObjectId, flags: u64, packet_size: u32, max_packets: u32 } -> i32;
    GetSupportedImageFormats {
        context: ObjectId, flags: u64, image_type: u32,
    } -> FormatsReply;
    /// A zero-terminated `cl_sampler_properties` list (the 1.x call is turned into one).
    /// `properties` of `clCreateSamplerWithProperties` (`None`: NULL); `legacy` for the 1.x call,
    /// whose three arguments travel as a property list but which reaches the driver as itself
    /// (the two calls differ in what `CL_SAMPLER_PROPERTIES` reports).
    CreateSampler { id: ObjectId, context: ObjectId, properties: Option<Vec<u64>>, legacy: bool } -> i32;
    CreateProgramWithSource {
        id: ObjectId, context: ObjectId, #[serde(with = "crate::bulk")] sources: Vec<Vec<u8>>,
    } -> i32;
    /// With `includes`, `options` has lost its `-I` folders: the worker adds its copies.
    BuildProgram {
        program: ObjectId, devices: Option<Vec<ObjectId>>, #[serde(with = "crate::bulk")] options: Option<Vec<u8>>,
        includes: Option<AppIncludes>, notify: Option<u64>,
    } -> BuildReply;
    CreateProgramWithBinary {
        id: ObjectId, context: ObjectId, devices: Vec<ObjectId>, #[serde(with = "crate::bulk")] binaries: Vec<Vec<u8>>,
    } -> StatusesReply;
    CreateProgramWithIl { id: ObjectId, context: ObjectId, #[serde(with = "crate::bulk")] il: Vec<u8> } -> i32;
    /// `names` is the semicolon-separated list, without its NUL.
    CreateProgramWithBuiltInKernels {
        id: ObjectId, context: ObjectId, devices: Vec<ObjectId>, #[serde(with = "crate::bulk")] names: Vec<u8>,
    } -> i32;
    /// `headers` pairs each header program with its include name.
    CompileProgram {
        program: ObjectId, devices: Option<Vec<ObjectId>>, #[serde(with = "crate::bulk")] options: Option<Vec<u8>>,
        #[serde(with = "crate::bulk")] headers: Vec<(ObjectId, Vec<u8>)>, includes: Option<AppIncludes>, notify: Option<u64>,
    } -> BuildReply;
    LinkProgram {
        id: ObjectId, context: ObjectId, devices: Option<Vec<ObjectId>>, #[serde(with = "crate::bulk")] options: Option<Vec<u8>>,
        inputs: Vec<ObjectId>, notify: Option<u64>,
    } -> CreatedReply;
    /// `clGetProgramInfo(CL_PROGRAM_BINARIES)`: the value is an array of application pointers,
    /// so the bytes come back and the shim writes them where those pointers say.
    GetProgramBinaries { program: ObjectId } -> BinariesReply;
    SetProgramSpecializationConstant {
        program: ObjectId, spec_id: u32, #[serde(with = "crate::bulk")] value: Vec<u8>,
    } -> i32;
    UnloadPlatformCompiler { platform: ObjectId } -> i32;
    CreateKernel { id: ObjectId, program: ObjectId, #[serde(with = "crate::bulk")] name: Vec<u8> } -> KernelReply;
    CreateKernelsInProgram { program: ObjectId, ids: Vec<ObjectId> } -> KernelsReply;
    CloneKernel { id: ObjectId, source: ObjectId } -> i32;
    /// `device` 0 is NULL.
    GetKernelSubGroupInfo {
        kernel: ObjectId, device: ObjectId, param: u32, #[serde(with = "crate::bulk")] input: Vec<u8>,
    } -> InfoReply;
    /// `ids` are for the new devices (none: a count query).
    CreateSubDevices { device: ObjectId, properties: Vec<i64>, ids: Vec<ObjectId> } -> CountReply;
    /// `queue` `None` is NULL (the driver says what that means on its device).
    SetDefaultDeviceCommandQueue {
        context: ObjectId, device: ObjectId, queue: Option<ObjectId>,
    } -> i32;
    /// `args` are the arguments set since the kernel's last enqueue.
    EnqueueNdRange {
        queue: ObjectId, kernel: ObjectId, args: Vec<(u32, ArgValue)>, work_dim: u32,
        offset: Option<Dims>, global: Option<Dims>, local: Option<Dims>, sync: EnqueueSync,
    } -> i32;
    /// From the lane (always blocking: the shim reuses it) or from a segment the shim keeps
    /// until the write's event completes.
    EnqueueWriteBuffer {
        queue: ObjectId, mem: ObjectId, blocking: bool, offset: u64, data: DataRef, sync: EnqueueSync,
    } -> i32;
    /// Into the lane (blocking) or into a segment the shim copies out of on completion.
    EnqueueReadBuffer {
        queue: ObjectId, mem: ObjectId, blocking: bool, offset: u64, into: DataRef, sync: EnqueueSync,
    } -> i32;
    EnqueueCopyBuffer {
        queue: ObjectId, src: ObjectId, dst: ObjectId, src_offset: u64, dst_offset: u64, size: u64,
        sync: EnqueueSync,
    } -> i32;
    EnqueueFillBuffer {
        queue: ObjectId, mem: ObjectId, #[serde(with = "crate::bulk")] pattern: Vec<u8>, offset: u64, size: u64, sync: EnqueueSync,
    } -> i32;
    /// Maps and copies the region into `segment`, which the application sees as the mapping.
    /// A non-blocking map returns at once; `FillMapping` copies once its event is complete.
    /// With `in_place` (a zero-copy buffer), `segment` only names the mapping: the shim hands
    /// out its own view of the buffer's memory, and the worker copies only if the driver mapped
    /// elsewhere than the buffer's host pointer.
    EnqueueMapBuffer {
        queue: ObjectId, mem: ObjectId, blocking: bool, flags: u64, offset: u64, size: u64, segment: u64,
        in_place: bool, sync: EnqueueSync,
    } -> i32;
    /// A non-blocking map has completed: copy the mapped region into its segment now.
    FillMapping { segment: u64 } -> i32;
    /// Copies `segment` back (if `write_back`), unmaps and forgets the segment. `stands_for`:
    /// 0, or the command type the event answers (`CL_COMMAND_READ_BUFFER` where the map and
    /// unmap carried a blocking read the shim made itself).
    EnqueueUnmapMemObject {
        queue: ObjectId, mem: ObjectId, segment: u64, write_back: bool, stands_for: u32, sync: EnqueueSync,
    } -> i32;
    /// `clEnqueueRead/WriteImage` and `clEnqueueRead/WriteBufferRect`; `data` holds the packed
    /// region (see `RegionTarget`).
    EnqueueRegionTransfer {
        queue: ObjectId, mem: ObjectId, write: bool, blocking: bool, target: RegionTarget, region: [u64; 3],
        data: DataRef, sync: EnqueueSync,
    } -> i32;
    EnqueueCopyRegion {
        queue: ObjectId, src: ObjectId, dst: ObjectId, kind: CopyKind, src_origin: [u64; 3], dst_origin: [u64; 3],
        region: [u64; 3], src_pitches: (u64, u64), dst_pitches: (u64, u64), sync: EnqueueSync,
    } -> i32;
    EnqueueFillImage {
        queue: ObjectId, mem: ObjectId, #[serde(with = "crate::bulk")] color: Vec<u8>, origin: [u64; 3], region: [u64; 3], sync: EnqueueSync,
    } -> i32;
    /// Maps the region and copies it, packed, into `segment`; unmapped by `EnqueueUnmapMemObject`.
    EnqueueMapImage {
        queue: ObjectId, mem: ObjectId, blocking: bool, flags: u64, origin: [u64; 3], region: [u64; 3],
        segment: u64, sync: EnqueueSync,
    } -> MapImageReply;
    EnqueueMigrateMemObjects {
        queue: ObjectId, mems: Vec<ObjectId>, flags: u64, sync: EnqueueSync,
    } -> i32;
    EnqueueMarkerOrBarrier { queue: ObjectId, barrier: bool, sync: EnqueueSync } -> i32;
    FlushOrFinish { queue: ObjectId, finish: bool } -> i32;
    WaitForEvents { events: Vec<ObjectId> } -> i32;
    CreateUserEvent { id: ObjectId, context: ObjectId } -> i32;
    SetUserEventStatus { event: ObjectId, status: i32 } -> i32;
    /// The worker registers its own callback and sends `Notification::EventStatus` with `token`.
    SetEventCallback { event: ObjectId, callback_type: i32, token: u64 } -> i32;
    /// `clGetDeviceAndHostTimer` (`with_device`) or `clGetHostTimer`.
    GetTimers { device: ObjectId, with_device: bool } -> TimersReply;
    /// The shim no longer uses this shared segment.
    DropSegment { segment: u64 } -> i32;
    /// The shim carves nothing more out of this slab (`CreateBuffer`'s `BufferMemory::Slab`)
    /// until the worker says it holds no buffer in it (`Notification::SlabIdle`): the shim then
    /// carves it again from its start, its pages warm on both sides.
    RetireSlab { segment: u64 } -> i32;
    /// A replay checkpoint's read-back of many small buffers in one call: each of `reads` (a
    /// buffer and its size, as the shim recorded it) is read whole into `segment`, one after
    /// the other from its start (`read_back_offsets`), and the queue is finished. The shim
    /// copies out only the sizes it asked for, at the offsets it computed.
    ReadBack { queue: ObjectId, reads: Vec<(ObjectId, u64)>, segment: u64 } -> i32;
    /// The first `clSetKernelArg` of each shape (index, size, kind of value) goes to the driver
    /// at once, so its errors come from the call that caused them; later ones travel with the
    /// enqueue.
    SetKernelArg { kernel: ObjectId, index: u32, value: ArgValue } -> i32;
    /// Asks the driver whether it takes program release callbacks (it registers a no-op); the
    /// application's callback itself runs in the shim.
    ProbeProgramReleaseCallback { program: ObjectId } -> i32;
    /// cl_khr_command_buffer; the worker refuses drivers whose version has other signatures.
    CreateCommandBuffer { id: ObjectId, queues: Vec<ObjectId>, properties: Option<Vec<u64>> } -> i32;
    FinalizeCommandBuffer { buffer: ObjectId } -> i32;
    /// `clCommand*KHR`: `queue` is the call's (NULL: the buffer's own); `wait` its sync points.
    RecordCommand {
        buffer: ObjectId, queue: Option<ObjectId>, command: RecordedCommand, wait: Vec<u32>,
    } -> SyncPointReply;
    EnqueueCommandBuffer { queues: Vec<ObjectId>, buffer: ObjectId, sync: EnqueueSync } -> i32;
    /// The execution status of each event (`CL_INVALID_EVENT` for an id the worker does not
    /// hold), in order: the shim settles its non-blocking transfers with one call, not one each.
    /// Each event of `events` also in `release_settled` (the shim's own, which the application
    /// never saw) is released once its status is `CL_COMPLETE` or an error, in the same call.
    EventStatuses { events: Vec<ObjectId>, release_settled: Vec<ObjectId> } -> StatusesReply;
    /// The execution status of each event and, for a complete one, its profiling start and
    /// end: the trace and the timing report time the commands they saw complete with one call,
    /// not three each.
    EventProfiles { events: Vec<ObjectId> } -> ProfilesReply;
    /// A transfer, map or unmap the shim made itself (`shim/src/direct.rs`: a zero-copy buffer
    /// on an idle queue), for which the application asked an event: the worker makes it, a user
    /// event of the queue's context set complete, that answers `CL_EVENT_COMMAND_TYPE` with
    /// `command_type` and `CL_EVENT_COMMAND_QUEUE` with `queue` as the command's own event
    /// would, and refuses `clSetUserEventStatus`. No command reaches the queue, so it stays
    /// idle. `sync.wait` is empty; only a queue without profiling gets one (a user event has no
    /// timestamps).
    EnqueueDone { queue: ObjectId, command_type: u32, sync: EnqueueSync } -> i32;
}

/// Where each read of a `ReadBack` of `sizes` lands in its segment, one after the other, each
/// at a multiple of 64 bytes, and the bytes they take in all; `None` if that overflows. The shim
/// and the worker each work them out from the sizes: no offset travels.
pub fn read_back_offsets(sizes: impl IntoIterator<Item = u64>) -> Option<(Vec<u64>, u64)> {
    let mut at = 0u64;
    let offsets = sizes
        .into_iter()
        .map(|size| {
            let start = at;
            at = start.checked_add(size)?.checked_next_multiple_of(64)?;
            Some(start)
        })
        .collect::<Option<Vec<u64>>>()?;
    Some((offsets, at))
}

/// A borrowed byte string, encoded as postcard encodes bytes (its length, then the bytes, in one
/// copy): a lane frame wraps an encoded message without re-encoding it byte by byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBytes<'a>(pub &'a [u8]);

impl Serialize for RawBytes<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawBytes<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a [u8]>::deserialize(d).map(RawBytes)
    }
}

/// The envelope of every message on a lane, in both directions (`crate::spill` says how each
/// is used). A message travels inline, or, too big for the lane, in a sealed shared segment
/// (a request) or held by the worker until the shim fetches it into a segment the shim made (a
/// reply): the message itself is the same postcard `Request` or reply either way, so over a
/// byte stream every frame could be `Inline`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// The encoded message.
    #[serde(borrow)]
    Inline(RawBytes<'a>),
    /// Request: the encoded request is the first `len` bytes of shared segment `segment`.
    InSegment { segment: u64, len: u64 },
    /// Reply: the worker holds an encoded reply of `len` bytes for the shim to fetch.
    Held { len: u64 },
    /// Request: copy the held reply to the start of segment `segment` (made by the shim).
    Fetch { segment: u64 },
    /// Reply to `Fetch`: the `len` bytes are in the segment.
    Fetched { len: u64 },
    /// Request: the frame `inner` (`Inline` or `InSegment`), and how long the worker spent on
    /// it, asked for. The shim sends it only while the application's timing report is on, so
    /// the worker reads no clock for anyone else.
    #[serde(borrow)]
    TimeIt(RawBytes<'a>),
    /// Reply to `TimeIt`: the answer's frame `inner` (`Inline` or `Held`), and the nanoseconds
    /// the worker spent serving the request (decoding it, the driver's call, encoding the reply)
    /// by its own monotonic clock. The worker's claim: the shim clamps it to the round trip it
    /// measured itself.
    Timed {
        worker_ns: u64,
        #[serde(borrow)]
        inner: RawBytes<'a>,
    },
}

/// What a request that may be posted is, for the report of its failure (`Request::posted`).
#[derive(Debug, PartialEq, Eq)]
pub enum Posted<'a> {
    /// An enqueue: a failure is reported later (its event fails, the queue remembers the code).
    Enqueue { queue: ObjectId, sync: &'a EnqueueSync },
    /// The release of a memory object, kernel, sampler or event, which succeeds whatever the
    /// driver says (the shim has forgotten the handle already, as it does when the worker is
    /// dead); or a slab's retirement, whose failure only keeps the slab from coming back.
    Release,
    /// A buffer's creation, with no bytes of the application's to carry: a failure leaves the
    /// id failed with the driver's code, which each later use of it returns (a driver may
    /// allocate a buffer's memory at its first use, and its enqueues then fail so:
    /// `CL_MEM_OBJECT_ALLOCATION_FAILURE`), and the context's callback hears it.
    Create { context: ObjectId, id: ObjectId },
    /// An event callback's registration (`SetEventCallback`), whose every refusal but the
    /// driver's lack of memory the shim makes itself (a live event, a function, a status it
    /// may be registered for): a driver that refuses it anyway has the callback run at once
    /// with the driver's code (`Notification::EventStatus`), so an application waiting for it
    /// does not wait forever.
    Callback { token: u64 },
}

impl Request {
    /// For a request that may be posted (sent without waiting for its reply): what it is. Only
    /// requests whose reply is a bare status and whose failure can be reported later (or does
    /// not matter) qualify; the worker refuses anything else that arrives posted. A posted
    /// request still runs after every request the application made before it, on any thread
    /// (the shim waits for other lanes to drain first, as for a call).
    pub fn posted(&self) -> Option<Posted<'_>> {
        let enqueue = |queue, sync| Some(Posted::Enqueue { queue, sync });
        match self {
            Request::EnqueueNdRange(r) => enqueue(r.queue, &r.sync),
            Request::EnqueueCopyBuffer(r) => enqueue(r.queue, &r.sync),
            Request::EnqueueFillBuffer(r) => enqueue(r.queue, &r.sync),
            Request::EnqueueMarkerOrBarrier(r) => enqueue(r.queue, &r.sync),
            Request::EnqueueUnmapMemObject(r) => enqueue(r.queue, &r.sync),
            Request::EnqueueDone(r) => enqueue(r.queue, &r.sync),
            // Only a non-blocking one from a segment: the lane's bulk area is reused by the next
            // call, and a blocking write must not return before the data is in the buffer.
            Request::EnqueueWriteBuffer(r) if !r.blocking && matches!(r.data, DataRef::Segment { .. }) => {
                enqueue(r.queue, &r.sync)
            }
            // A non-blocking read into a segment of its own: the shim copies out of it only once
            // the event says complete (a rejected read's event fails instead: `late_failure`).
            Request::EnqueueReadBuffer(r) if !r.blocking && matches!(r.into, DataRef::Segment { .. }) => {
                enqueue(r.queue, &r.sync)
            }
            Request::Release(_) | Request::RetireSlab(_) => Some(Posted::Release),
            Request::SetEventCallback(r) => Some(Posted::Callback { token: r.token }),
            // Not with bytes in the lane's bulk area, which the next call reuses; a segment's
            // bytes stay until the shim sees the post has run (`Lane::has_run`).
            Request::CreateBuffer(r) if !matches!(r.host_data, Some(DataRef::Lane { .. })) => {
                Some(Posted::Create { context: r.context, id: r.id })
            }
            _ => None,
        }
    }
}

/// Messages on the socket from the shim to its worker.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum ShimMessage {
    Hello(crate::handshake::Hello),
    /// Carries one fd: the lane's memfd. The worker starts a thread to serve it.
    NewLane {
        lane: u64,
    },
    /// Carries one fd: a shared segment for bulk data (maps, large transfers).
    NewSegment {
        segment: u64,
    },
}

/// A platform or device the worker enumerated, with the id the shim will use for it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Enumerated {
    pub id: ObjectId,
    pub platform: ObjectId,
}

/// Messages on the socket from the worker to the shim.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum WorkerMessage {
    /// `profile` and `layers` describe the cage the worker runs in (one line per layer).
    Welcome {
        version: u32,
        driver: String,
        profile: String,
        layers: Vec<String>,
        platforms: Vec<ObjectId>,
        devices: Vec<Enumerated>,
    },
    Refused {
        reason: String,
    },
    Notify(Notification),
}

/// Something the driver did on its own time: the shim runs the application's callback.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    EventStatus {
        token: u64,
        status: i32,
    },
    ContextError {
        token: u64,
        errinfo: String,
        #[serde(with = "crate::bulk")]
        private_info: Vec<u8>,
    },
    BuildDone {
        token: u64,
    },
    /// A posted request (`Request::posted`) failed in the driver after the application's call
    /// had returned: `token` is its context's callback, `op` the call (`OP_NAMES` index), `code`
    /// the driver's error. The shim words the message itself.
    LateError {
        token: u64,
        op: u32,
        code: i32,
    },
    /// The retired slab `segment` (`Request::RetireSlab`) holds no buffer the driver has not
    /// destroyed: the shim may carve it again once its own views of it are gone.
    SlabIdle {
        segment: u64,
    },
}

/// The application (shim) asking the broker for its workers.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum BrokerRequest {
    Hello(crate::handshake::Hello),
    /// The worker for this driver died: start a replacement (answered with `Workers`).
    Respawn {
        driver: String,
    },
    /// Why did this driver's last worker die? (Answered with `Death`.)
    WhyDied {
        driver: String,
    },
    /// The first message of a shim's second connection, made while its timing report is on:
    /// the connection then answers the broker's `Query` with `Report`, for the application the
    /// kernel says is at its other end, until it closes.
    ServeReports(crate::handshake::Hello),
    /// The shim's answer to `Query`: its timing report as it stands (`None`: timing is off).
    Report {
        timing: Option<String>,
    },
    /// `cloister timing`: the reports of application `pid` (`None`: of every application that
    /// serves them here); answered with `Reports`.
    AskReports {
        hello: crate::handshake::Hello,
        pid: Option<u32>,
    },
    /// Replay recovery carried the application over to this driver's newest worker (not
    /// answered): the broker adds it to the crash reports of the workers that died since the
    /// last carry-over. The application's word, bounded by the broker (`CarriedOver::MAX_*`).
    CarriedOver(CarriedOver),
}

/// One application's answer to `AskReports`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct AppReport {
    pub pid: u32,
    pub app: String,
    /// The report, or why the application gave none.
    pub timing: Result<String, String>,
}

/// What replay recovery did after a worker's death, as the shim tells the broker.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct CarriedOver {
    pub driver: String,
    /// Objects rebuilt under the application's handles.
    pub objects_rebuilt: u32,
    /// Commands of the journal run again.
    pub commands_replayed: u32,
    /// Objects that could not be restored (they answer `CL_DEVICE_NOT_AVAILABLE`).
    pub objects_lost: u32,
    /// Commands and objects given up, one line each saying which and why.
    pub dropped: Vec<String>,
}

impl CarriedOver {
    /// The most `dropped` lines the broker keeps.
    pub const MAX_DROPPED: usize = 32;
    /// The longest `dropped` line the broker keeps, in bytes.
    pub const MAX_LINE: usize = 512;
}

/// One worker the broker started for this application; its channel fd rides along.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct WorkerGrant {
    pub driver: String,
    pub library: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum BrokerReply {
    /// One fd per grant, in order.
    Workers {
        version: u32,
        grants: Vec<WorkerGrant>,
        errors: Vec<String>,
    },
    Refused {
        reason: String,
    },
    /// The cause and the crash report's path, once the broker has written it.
    Death {
        note: Option<String>,
    },
    /// On a `ServeReports` connection: the broker asks for the reports (answered `Report`).
    Query,
    /// The answer to `AskReports`.
    Reports {
        reports: Vec<AppReport>,
    },
}

/// Replies built from a bare status, for error paths.
macro_rules! status_only {
    ($($t:ident { $($f:ident),* }),*) => {$(
        impl From<i32> for $t {
            fn from(status: i32) -> Self { $t { status, $($f: Default::default()),* } }
        }
    )*};
}
status_only!(
    InfoReply { value_status, value },
    TimersReply { device_timestamp, host_timestamp },
    IdsReply { ids },
    KernelReply { num_args },
    KernelsReply { count, num_args },
    CountReply { count },
    StatusesReply { statuses },
    ProfilesReply { profiles },
    CreatedReply { created, callback_sent },
    BuildReply { callback_sent },
    BinariesReply { binaries },
    FormatsReply { formats },
    MapImageReply { row_pitch, slice_pitch },
    SyncPointReply { sync_point }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_vouched_enqueues_and_creations_may_be_posted_and_nothing_else() {
        assert_eq!(Request::Release(Release { object: 7 }).posted(), Some(Posted::Release));
        let callback = SetEventCallback { event: 4, callback_type: CL_COMPLETE, token: 11 };
        assert_eq!(Request::SetEventCallback(callback).posted(), Some(Posted::Callback { token: 11 }));
        let sync = EnqueueSync::default();
        let write = |blocking, data| {
            Request::EnqueueWriteBuffer(EnqueueWriteBuffer {
                queue: 3,
                mem: 4,
                blocking,
                offset: 0,
                data,
                sync: sync.clone(),
            })
        };
        let segment = DataRef::Segment { id: 1, offset: 0, len: 4 };
        assert_eq!(write(false, segment).posted(), Some(Posted::Enqueue { queue: 3, sync: &sync }));
        assert_eq!(write(true, segment).posted(), None, "a blocking write waits for its reply");
        assert_eq!(write(false, DataRef::Lane { offset: 0, len: 4 }).posted(), None, "the lane is reused");
        assert_eq!(Request::FlushOrFinish(FlushOrFinish { queue: 3, finish: true }).posted(), None);
        let create = |host_data, memory| {
            Request::CreateBuffer(CreateBuffer {
                id: 9,
                context: 2,
                properties: None,
                flags: 0,
                size: 64,
                host_data,
                memory,
            })
        };
        assert_eq!(create(None, None).posted(), Some(Posted::Create { context: 2, id: 9 }));
        let slab = Some(BufferMemory::Slab { segment: 1, offset: 128 });
        assert_eq!(create(None, slab).posted(), Some(Posted::Create { context: 2, id: 9 }));
        assert_eq!(create(Some(DataRef::Lane { offset: 0, len: 64 }), None).posted(), None, "the lane is reused");
        let held = Some(Posted::Create { context: 2, id: 9 });
        assert_eq!(create(Some(segment), None).posted(), held, "a segment the shim holds until it ran");
    }

    #[test]
    fn read_backs_land_one_after_the_other_on_64_byte_boundaries() {
        assert_eq!(read_back_offsets([]), Some((vec![], 0)));
        assert_eq!(read_back_offsets([4, 64, 65, 1]), Some((vec![0, 64, 128, 256], 320)));
        assert_eq!(read_back_offsets([0, 0, 3]), Some((vec![0, 0, 0], 64)));
        assert_eq!(read_back_offsets([u64::MAX - 10]), None, "overflow");
        assert_eq!(read_back_offsets([1, u64::MAX - 63]), None);
    }
}
