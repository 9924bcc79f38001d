//! Every `unsafe` block and FFI call of the crate: the IREE runtime's C API through eerie-sys, and
//! the one call of `mlxcel_model`'s unsafe API, releasing a checkpoint's bytes once they are
//! uploaded ([`copy_tensors_then_release`]).
//!
//! The objects here are not `Send`: they live on the runtime thread ([`super::Runtime`]), which
//! owns them for their whole life. Each wrapper releases its IREE reference on drop.

use std::ffi::c_void;
use std::os::raw::c_char;
use std::ptr;

use eerie_sys::runtime as sys;
use mlxcel_model::Checkpoint;

use crate::hlo::ElementType;

// The high-level runtime API (iree/runtime/api.h) is compiled into eerie-sys's archive but not in
// its bindings; these declarations mirror iree/runtime/{instance,session}.h of IREE 3.13.
#[repr(C)]
struct InstanceOptions {
    driver_registry: *mut sys::iree_hal_driver_registry_t,
}

#[repr(C)]
struct SessionOptions {
    context_flags: u32,
    builtin_modules: u64,
}

#[repr(C)]
struct RuntimeInstance {
    _opaque: [u8; 0],
}

#[repr(C)]
struct RuntimeSession {
    _opaque: [u8; 0],
}

unsafe extern "C" {
    fn iree_allocator_libc_ctl(
        self_: *mut c_void,
        command: sys::iree_allocator_command_t,
        params: *const c_void,
        inout_ptr: *mut *mut c_void,
    ) -> sys::iree_status_t;
    fn iree_runtime_instance_options_initialize(out: *mut InstanceOptions);
    fn iree_runtime_instance_options_use_all_available_drivers(options: *mut InstanceOptions);
    fn iree_runtime_instance_create(
        options: *const InstanceOptions,
        host_allocator: sys::iree_allocator_t,
        out: *mut *mut RuntimeInstance,
    ) -> sys::iree_status_t;
    fn iree_runtime_instance_try_create_default_device(
        instance: *mut RuntimeInstance,
        driver_name: sys::iree_string_view_t,
        out_device: *mut *mut sys::iree_hal_device_t,
    ) -> sys::iree_status_t;
    fn iree_runtime_session_options_initialize(out: *mut SessionOptions);
    fn iree_runtime_session_create_with_device(
        instance: *mut RuntimeInstance,
        options: *const SessionOptions,
        device: *mut sys::iree_hal_device_t,
        host_allocator: sys::iree_allocator_t,
        out: *mut *mut RuntimeSession,
    ) -> sys::iree_status_t;
    fn iree_runtime_session_release(session: *mut RuntimeSession);
    fn iree_runtime_session_device_allocator(
        session: *const RuntimeSession,
    ) -> *mut sys::iree_hal_allocator_t;
    fn iree_runtime_session_append_bytecode_module_from_memory(
        session: *mut RuntimeSession,
        flatbuffer: sys::iree_const_byte_span_t,
        flatbuffer_allocator: sys::iree_allocator_t,
    ) -> sys::iree_status_t;
    fn iree_runtime_session_call_by_name(
        session: *mut RuntimeSession,
        full_name: sys::iree_string_view_t,
        input_list: *mut sys::iree_vm_list_t,
        output_list: *mut sys::iree_vm_list_t,
    ) -> sys::iree_status_t;
}

fn system_allocator() -> sys::iree_allocator_t {
    sys::iree_allocator_t {
        self_: ptr::null_mut(),
        ctl: Some(iree_allocator_libc_ctl),
    }
}

/// An allocator that never frees: for memory Rust owns and outlives the IREE object using it.
fn null_allocator() -> sys::iree_allocator_t {
    sys::iree_allocator_t {
        self_: ptr::null_mut(),
        ctl: None,
    }
}

fn string_view(s: &str) -> sys::iree_string_view_t {
    sys::iree_string_view_t {
        data: s.as_ptr() as *const c_char,
        size: s.len(),
    }
}

/// Turns a status into a message, consuming it.
fn check(status: sys::iree_status_t, what: &str) -> Result<(), String> {
    if status.is_null() {
        return Ok(());
    }
    let allocator = system_allocator();
    let mut buffer: *mut c_char = ptr::null_mut();
    let mut length = 0usize;
    // SAFETY: `status` is a non-OK status returned by IREE and owned by us; to_string allocates
    // `buffer` with `allocator`, which we free below; iree_status_free consumes the status.
    let message = unsafe {
        let ok = sys::iree_status_to_string(status, &allocator, &mut buffer, &mut length);
        let text = if ok && !buffer.is_null() {
            let bytes = std::slice::from_raw_parts(buffer as *const u8, length);
            let text = String::from_utf8_lossy(bytes).into_owned();
            sys::iree_allocator_free(allocator, buffer as *mut c_void);
            text
        } else {
            "unknown IREE error".to_owned()
        };
        sys::iree_status_free(status);
        text
    };
    Err(format!("{what}: {message}"))
}

/// The process's IREE instance and `local-task` CPU device, created on first use and never
/// destroyed.
///
/// Destroying a task device tears down its memory pools, and IREE asserts that no buffer drawn
/// from them is still alive. Its worker threads drop their last references to a submission's
/// buffers a moment after signalling completion, so a device destroyed right after its last call
/// aborts the process now and then (CI hit it with three runtimes in one test binary). One device
/// for the whole process avoids the race, and runtimes share one set of worker threads instead of
/// each starting its own.
struct SharedDevice {
    instance: *mut RuntimeInstance,
    device: *mut sys::iree_hal_device_t,
}

// SAFETY: the instance and the HAL device are internally synchronised (IREE documents HAL devices
// and instances as thread-safe; only sessions, contexts and lists are single-threaded), and both
// live for the rest of the process once created.
unsafe impl Send for SharedDevice {}
// SAFETY: as above; the pointers themselves are never written after creation.
unsafe impl Sync for SharedDevice {}

static SHARED_DEVICE: std::sync::OnceLock<Result<SharedDevice, String>> =
    std::sync::OnceLock::new();

fn shared_device() -> Result<&'static SharedDevice, String> {
    SHARED_DEVICE
        .get_or_init(|| {
            let mut shared = SharedDevice {
                instance: ptr::null_mut(),
                device: ptr::null_mut(),
            };
            // SAFETY: the options struct is a plain C struct initialised by IREE; out-pointers
            // are valid locals. On failure whatever was created is kept (and leaked) with the
            // error, which is reported to every caller.
            unsafe {
                let mut options = InstanceOptions {
                    driver_registry: ptr::null_mut(),
                };
                iree_runtime_instance_options_initialize(&mut options);
                iree_runtime_instance_options_use_all_available_drivers(&mut options);
                check(
                    iree_runtime_instance_create(
                        &options,
                        system_allocator(),
                        &mut shared.instance,
                    ),
                    "creating the IREE instance",
                )?;
                check(
                    iree_runtime_instance_try_create_default_device(
                        shared.instance,
                        string_view("local-task"),
                        &mut shared.device,
                    ),
                    "creating the IREE local-task device",
                )?;
            }
            Ok(shared)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A session on the process's `local-task` CPU device, holding the loaded modules.
pub(super) struct Session {
    device: *mut sys::iree_hal_device_t,
    session: *mut RuntimeSession,
    /// Module bytes must outlive the session that maps them.
    modules: Vec<Vec<u8>>,
}

impl Session {
    pub(super) fn new() -> Result<Self, String> {
        let shared = shared_device()?;
        let mut s = Session {
            device: shared.device,
            session: ptr::null_mut(),
            modules: Vec::new(),
        };
        // SAFETY: the options struct is a plain C struct initialised by IREE; the instance and
        // device live for the process; the session retains the device it is given.
        unsafe {
            let mut session_options = SessionOptions {
                context_flags: 0,
                builtin_modules: 0,
            };
            iree_runtime_session_options_initialize(&mut session_options);
            check(
                iree_runtime_session_create_with_device(
                    shared.instance,
                    &session_options,
                    shared.device,
                    system_allocator(),
                    &mut s.session,
                ),
                "creating the IREE session",
            )?;
        }
        Ok(s)
    }

    /// Appends a compiled module (`.vmfb` bytes) to the session.
    pub(super) fn load_module(&mut self, bytes: Vec<u8>) -> Result<(), String> {
        let span = sys::iree_const_byte_span_t {
            data: bytes.as_ptr(),
            data_length: bytes.len(),
        };
        // SAFETY: the bytes are kept in `self.modules` for the session's life (a Vec's heap
        // buffer does not move when the Vec is moved); the null allocator means IREE never frees
        // them.
        unsafe {
            check(
                iree_runtime_session_append_bytecode_module_from_memory(
                    self.session,
                    span,
                    null_allocator(),
                ),
                "loading the module",
            )?;
        }
        self.modules.push(bytes);
        Ok(())
    }

    /// A device buffer holding a copy of `data`, of `dims` and `element`.
    pub(super) fn upload(
        &self,
        data: &[u8],
        dims: &[usize],
        element: ElementType,
    ) -> Result<BufferView, String> {
        let element_type = match element {
            ElementType::F32 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_FLOAT_32,
            ElementType::F16 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_FLOAT_16,
            ElementType::I32 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_INT_32,
            ElementType::U32 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_UINT_32,
            ElementType::U8 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_UINT_8,
            // Two elements a byte, the first in the low nibble.
            ElementType::U4 => sys::iree_hal_element_types_t_IREE_HAL_ELEMENT_TYPE_UINT_4,
            other => return Err(format!("cannot upload {other:?} tensors")),
        };
        let shape: Vec<sys::iree_hal_dim_t> = dims.iter().map(|&d| d as _).collect();
        let params = sys::iree_hal_buffer_params_t {
            usage: sys::iree_hal_buffer_usage_bits_t_IREE_HAL_BUFFER_USAGE_DEFAULT as _,
            access: sys::iree_hal_memory_access_bits_t_IREE_HAL_MEMORY_ACCESS_ALL as _,
            type_: sys::iree_hal_memory_type_bits_t_IREE_HAL_MEMORY_TYPE_DEVICE_LOCAL as _,
            queue_affinity: 0,
            min_alignment: 0,
        };
        let span = sys::iree_const_byte_span_t {
            data: data.as_ptr(),
            data_length: data.len(),
        };
        let mut view = ptr::null_mut();
        // SAFETY: device and allocator belong to the live session; `shape` and `data` outlive the
        // call, which copies the bytes.
        unsafe {
            check(
                sys::iree_hal_buffer_view_allocate_buffer_copy(
                    self.device,
                    iree_runtime_session_device_allocator(self.session),
                    shape.len(),
                    shape.as_ptr(),
                    element_type as _,
                    sys::iree_hal_encoding_types_t_IREE_HAL_ENCODING_TYPE_DENSE_ROW_MAJOR as _,
                    params,
                    span,
                    &mut view,
                ),
                "allocating a buffer",
            )?;
        }
        Ok(BufferView(view))
    }

    /// Calls `function` (`module.name`) with `inputs`; returns its results.
    pub(super) fn call(
        &self,
        function: &str,
        inputs: &[&BufferView],
    ) -> Result<Vec<BufferView>, String> {
        let input_list = VmList::new(inputs.len())?;
        let output_list = VmList::new(16)?;
        // SAFETY: the lists are live; push_ref_retain takes its own reference to each buffer
        // view; results are retained before the output list is released.
        unsafe {
            for input in inputs {
                let mut r = sys::iree_hal_buffer_view_retain_ref(input.0);
                let status = sys::iree_vm_list_push_ref_move(input_list.0, &mut r);
                check(status, "passing an argument")?;
            }
            check(
                iree_runtime_session_call_by_name(
                    self.session,
                    string_view(function),
                    input_list.0,
                    output_list.0,
                ),
                &format!("calling {function}"),
            )?;
            let count = sys::iree_vm_list_size(output_list.0);
            let mut results = Vec::with_capacity(count);
            for i in 0..count {
                let view = sys::iree_vm_list_get_buffer_view_retain(output_list.0, i);
                if view.is_null() {
                    return Err(format!("{function}: result {i} is not a buffer view"));
                }
                results.push(BufferView(view));
            }
            Ok(results)
        }
    }

    /// Copies a buffer view's contents to the host.
    pub(super) fn read(&self, view: &BufferView, out: &mut [u8]) -> Result<(), String> {
        let length = view.byte_length();
        if length != out.len() {
            return Err(format!(
                "reading {} bytes from a {length}-byte buffer",
                out.len()
            ));
        }
        self.read_range(view, 0, out)
    }

    /// Copies `out.len()` bytes of a buffer view from byte `offset` to the host.
    pub(super) fn read_range(
        &self,
        view: &BufferView,
        offset: usize,
        out: &mut [u8],
    ) -> Result<(), String> {
        view.check_range(offset, out.len(), "reading")?;
        // SAFETY: the view is live and the range lies inside it (checked above); `out` is
        // writable for its length.
        unsafe {
            check(
                sys::iree_hal_device_transfer_d2h(
                    self.device,
                    sys::iree_hal_buffer_view_buffer(view.0),
                    offset as _,
                    out.as_mut_ptr() as *mut c_void,
                    out.len() as _,
                    TRANSFER_DEFAULT,
                    FOREVER,
                ),
                "reading a buffer",
            )
        }
    }

    /// Copies `data` into a buffer view from byte `offset`.
    pub(super) fn write_range(
        &self,
        view: &BufferView,
        offset: usize,
        data: &[u8],
    ) -> Result<(), String> {
        view.check_range(offset, data.len(), "writing")?;
        // SAFETY: the view is live and the range lies inside it (checked above); `data` is
        // readable for its length.
        unsafe {
            check(
                sys::iree_hal_device_transfer_h2d(
                    self.device,
                    data.as_ptr() as *const c_void,
                    sys::iree_hal_buffer_view_buffer(view.0),
                    offset as _,
                    data.len() as _,
                    TRANSFER_DEFAULT,
                    FOREVER,
                ),
                "writing a buffer",
            )
        }
    }

    /// Copies `length` bytes from byte `from_offset` of `from` to byte `to_offset` of `to` on
    /// the device. The ranges may be in one buffer but must not overlap.
    pub(super) fn copy_range(
        &self,
        from: &BufferView,
        from_offset: usize,
        to: &BufferView,
        to_offset: usize,
        length: usize,
    ) -> Result<(), String> {
        from.check_range(from_offset, length, "copying from")?;
        to.check_range(to_offset, length, "copying to")?;
        if from.same_buffer(to)
            && from_offset < to_offset + length
            && to_offset < from_offset + length
        {
            return Err(format!(
                "copying {length} bytes from offset {from_offset} to the overlapping offset \
                 {to_offset} of one buffer"
            ));
        }
        // SAFETY: both views are live and both ranges lie inside them (checked above).
        unsafe {
            check(
                sys::iree_hal_device_transfer_d2d(
                    self.device,
                    sys::iree_hal_buffer_view_buffer(from.0),
                    from_offset as _,
                    sys::iree_hal_buffer_view_buffer(to.0),
                    to_offset as _,
                    length as _,
                    TRANSFER_DEFAULT,
                    FOREVER,
                ),
                "copying between buffers",
            )
        }
    }
}

const TRANSFER_DEFAULT: sys::iree_hal_transfer_buffer_flags_t =
    sys::iree_hal_transfer_buffer_flag_bits_t_IREE_HAL_TRANSFER_BUFFER_FLAG_DEFAULT as _;

/// Transfers wait for the device as long as they take.
const FOREVER: sys::iree_timeout_t = sys::iree_timeout_t {
    type_: sys::iree_timeout_type_e_IREE_TIMEOUT_ABSOLUTE,
    nanos: i64::MAX as _,
};

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: the pointer is null or a reference we own, released once. The device is the
        // process's (see `SharedDevice`) and is not released.
        unsafe {
            if !self.session.is_null() {
                iree_runtime_session_release(self.session);
            }
        }
    }
}

/// One reference to an IREE buffer view.
pub(super) struct BufferView(*mut sys::iree_hal_buffer_view_t);

impl BufferView {
    /// The view's size in bytes.
    pub(super) fn byte_length(&self) -> usize {
        // SAFETY: the view is live.
        unsafe { sys::iree_hal_buffer_view_byte_length(self.0) as usize }
    }

    /// An error unless `length` bytes from `offset` lie inside the view.
    fn check_range(&self, offset: usize, length: usize, what: &str) -> Result<(), String> {
        let size = self.byte_length();
        if offset.checked_add(length).is_none_or(|end| end > size) {
            return Err(format!(
                "{what} {length} bytes at offset {offset} of a {size}-byte buffer"
            ));
        }
        Ok(())
    }

    /// Whether two views share one buffer (IREE may hand an argument buffer back as a result).
    pub(super) fn same_buffer(&self, other: &BufferView) -> bool {
        // SAFETY: both views are live.
        unsafe {
            sys::iree_hal_buffer_view_buffer(self.0) == sys::iree_hal_buffer_view_buffer(other.0)
        }
    }
}

impl Drop for BufferView {
    fn drop(&mut self) {
        // SAFETY: we own one reference.
        unsafe { sys::iree_hal_buffer_view_release(self.0) }
    }
}

/// A variant VM list.
struct VmList(*mut sys::iree_vm_list_t);

impl VmList {
    fn new(capacity: usize) -> Result<Self, String> {
        let mut list = ptr::null_mut();
        // SAFETY: a zeroed type def is the "any" (variant) element type; out-pointer is valid.
        unsafe {
            check(
                sys::iree_vm_list_create(
                    std::mem::zeroed(),
                    capacity,
                    system_allocator(),
                    &mut list,
                ),
                "creating a list",
            )?;
        }
        Ok(VmList(list))
    }
}

impl Drop for VmList {
    fn drop(&mut self) {
        // SAFETY: we own the list.
        unsafe { sys::iree_vm_list_release(self.0) }
    }
}

/// Runs `copy` (which reads the tensors `names` out of `checkpoint` into owned buffers, and
/// uploads them), then, once it succeeded, lets go of the checkpoint's bytes of `names` (the mapped
/// file's pages, or the tensors converted from a GGUF file), so that a load's peak is not the
/// checkpoint and the uploads together. A name the checkpoint does not hold is passed over; a
/// failed `copy` releases nothing.
pub(crate) fn copy_tensors_then_release<T: 'static, E: 'static>(
    checkpoint: &Checkpoint,
    names: &[String],
    copy: impl FnOnce(&Checkpoint) -> Result<T, E>,
) -> Result<T, E> {
    let copied = copy(checkpoint)?;
    for name in names {
        // SAFETY: `release_tensor` needs that no view of `name` is read afterwards. The views
        // `copy` took cannot be in its result (`T` and `E` are `'static`), and this crate reads a
        // checkpoint's tensors only in `weights.rs`, whose readers return owned copies and keep
        // no view, called from inside `copy` (`model.rs`).
        unsafe { checkpoint.release_tensor(name) };
    }
    Ok(copied)
}
