/* fsc export macro: symbols marked FSC_API are the public ABI of libfsc. */
#ifndef FSC_EXPORT_H
#define FSC_EXPORT_H

#if defined(_WIN32) && defined(FSC_BUILDING_SHARED)
#define FSC_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FSC_API __attribute__((visibility("default")))
#else
#define FSC_API
#endif

#endif
