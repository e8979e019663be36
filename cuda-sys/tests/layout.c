/* Prints the size and field offsets of the structures cuda-mem passes to the driver, as the C
 * compiler lays them out from cuda.h; tests/layout.rs compares them with the Rust bindings. */
#include <stddef.h>
#include <stdio.h>
#include <cuda.h>

#define SIZE(t) printf("%s %zu\n", #t, sizeof(t))
#define OFFSET(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(t, f))

int main(void) {
    SIZE(CUmemLocation);
    OFFSET(CUmemLocation, type);
    OFFSET(CUmemLocation, id);

    SIZE(CUmemPoolProps);
    OFFSET(CUmemPoolProps, allocType);
    OFFSET(CUmemPoolProps, handleTypes);
    OFFSET(CUmemPoolProps, location);
    OFFSET(CUmemPoolProps, win32SecurityAttributes);
    OFFSET(CUmemPoolProps, maxSize);
    OFFSET(CUmemPoolProps, usage);
    OFFSET(CUmemPoolProps, reserved);

    SIZE(CUmemAllocationProp);
    OFFSET(CUmemAllocationProp, type);
    OFFSET(CUmemAllocationProp, requestedHandleTypes);
    OFFSET(CUmemAllocationProp, location);
    OFFSET(CUmemAllocationProp, win32HandleMetaData);
    OFFSET(CUmemAllocationProp, allocFlags);
    OFFSET(CUmemAllocationProp, allocFlags.compressionType);
    OFFSET(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable);
    OFFSET(CUmemAllocationProp, allocFlags.usage);

    SIZE(CUmemAccessDesc);
    OFFSET(CUmemAccessDesc, location);
    OFFSET(CUmemAccessDesc, flags);

    SIZE(CUmemPoolPtrExportData);
    OFFSET(CUmemPoolPtrExportData, reserved);

    SIZE(CUuuid);
    SIZE(CUdeviceptr);
    SIZE(CUresult);
    return 0;
}
