from django.contrib import admin

from shop.models import Order

admin.site.register(Order)
