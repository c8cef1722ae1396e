// cupy_nwt_spin: one thread reads one byte at `touch` (which orders it after whatever wrote that
// byte, such as a batch's copy), then spins for `ns` nanoseconds on %globaltimer, the GPU's
// nanosecond wall clock. Unlike clock64() (SM cycles) its length does not depend on the SM clock.
// The address comes as an integer so that a caller holding any device array (CuPy, torch) passes
// its pointer without converting the array first.
extern "C" __global__ void cupy_nwt_spin(unsigned long long touch, long long ns, unsigned char* sink) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    unsigned char acc = *reinterpret_cast<const unsigned char*>(touch);
    do {
        acc = (unsigned char)(acc * 3 + 1);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while ((long long)(now - start) < ns);
    sink[0] = acc;
}
